"""A checkpoint's quantization_config -> its weight format: every method's layout, the exception lists, refusals,
and the bytes against a brute-force count over the modules transformers builds from the same config."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from tfcalc.calc.memory import weights_bytes, weights_bytes_by_component
from tfcalc.calc.params import count_params
from tfcalc.dtypes import parse_weight_precision
from tfcalc.errors import SpecError
from tfcalc.spec.hf_config import spec_from_hf_config
from tfcalc.spec.hf_quant import module_names

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"

# The layouts below follow the quantization_config each tool writes: llm-compressor (compressed-tensors, e.g.
# RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8: channel-wise fp8 weights, ignore lm_head), AutoAWQ (Qwen's -AWQ
# releases: bits 4, group_size 128, zero_point), AutoGPTQ (bits, group_size, desc_act, lm_head), NVIDIA ModelOpt
# (quant_algo, exclude_modules) and transformers' FineGrainedFP8 (weight_block_size, modules_to_not_convert).
CT_FP8_CHANNEL = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                      "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
                      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
       "modules_to_not_convert": None}
# unsloth/llama-3-8b-Instruct-bnb-4bit's (transformers BitsAndBytesConfig, written by to_dict)
BNB = {"_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": "bfloat16",
       "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
       "llm_int8_enable_fp32_cpu_offload": False, "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None,
       "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False, "quant_method": "bitsandbytes"}


def config(name: str, quant: Any) -> dict[str, Any]:
    data = json.loads((FIXTURE_DIR / f"{name}.json").read_text(encoding="utf-8"))
    data["quantization_config"] = quant
    return data


def native(name: str, quant: Any) -> str:
    return spec_from_hf_config(config(name, quant), origin=f"{name}.json", name=name).native_dtype


def ct(weights: dict[str, Any], targets: list[str] | None = None, ignore: list[str] | None = None) -> dict:
    return {"quant_method": "compressed-tensors", "ignore": ignore or ["lm_head"],
            "config_groups": {"group_0": {"targets": targets or ["Linear"], "weights": weights}}}


# --- formats per method ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("quant", "expected"), [
    (CT_FP8_CHANNEL, "fp8_e4m3"),
    (ct({"num_bits": 8, "type": "float", "strategy": "tensor"}), "fp8_e4m3"),
    (ct({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}), "fp8_block"),
    (ct({"num_bits": 8, "type": "int", "strategy": "channel"}), "int8"),
    # compressed-tensors integer groups are symmetric unless they say not (QuantizationArgs.symmetric = True): no
    # zero point is stored then (pack_quantized: weight_zero_point only for symmetric false)
    (ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}), "int4-g128-sym"),
    (ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True}), "int4-g32-sym"),
    (ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": False}), "int4-g128"),
    (ct({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}), "nvfp4"),
    (ct({"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}), "mxfp4"),
    (AWQ, "int4-g128"),
    (BNB, "nf4"),
    # Qwen's GPTQ-Int8 releases (Qwen2.5-7B-Instruct-GPTQ-Int8: bits 8, group_size 128); per channel: int8
    ({"quant_method": "gptq", "bits": 8, "group_size": 128, "desc_act": False, "sym": True}, "int8-g128"),
    ({"quant_method": "gptq", "bits": 8, "group_size": -1}, "int8"),
    (ct({"num_bits": 8, "type": "int", "strategy": "group", "group_size": 64}), "int8-g64-sym"),
    (ct({"num_bits": 8, "type": "int", "strategy": "group", "group_size": 64, "symmetric": False}), "int8-g64"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": False, "sym": True}, "int4-g64"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "lm_head": True}, "lm_head=int4-g128,default=int4-g128"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8_e4m3"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8_block"),
    ({"fmt": "e4m3", "weight_block_size": [128, 128]}, "fp8_block"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}, "fp8_e4m3"),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                   "exclude_modules": ["lm_head"]}}, "nvfp4"),
    (None, "bf16"),
])
def test_method_formats(quant: Any, expected: str) -> None:
    assert native("llama3-8b", quant) == expected


def test_exceptions_by_name_pattern_and_regex() -> None:
    # every layer's attention kept 16-bit, by a shell pattern (ModelOpt) or a regex (compressed-tensors)
    modelopt = {"quant_method": "modelopt", "quant_algo": "NVFP4", "exclude_modules": ["lm_head",
                                                                                        "model.layers.*.self_attn*"]}
    assert native("llama3-8b", modelopt) == "mlp=nvfp4,default=bf16"
    regex = ct({"num_bits": 8, "type": "float", "strategy": "channel"}, ignore=["lm_head", "re:.*self_attn.*"])
    assert native("llama3-8b", regex) == "mlp=fp8_e4m3,default=bf16"
    # a whole dotted part of the name, as transformers' modules_to_not_convert lists modules
    assert native("llama3-8b", {**AWQ, "modules_to_not_convert": ["self_attn"]}) == "mlp=int4-g128,default=bf16"
    # a name that is only a substring of a module's dotted part excepts nothing ("mlp.gate" is not mlp.gate_proj)
    assert native("llama3-8b", {**AWQ, "modules_to_not_convert": ["mlp.gate"]}) == "int4-g128"


def test_every_layer_named_one_by_one_is_a_whole_component() -> None:
    names = [f"model.layers.{i}.self_attn.{p}" for i in range(32) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    assert native("llama3-8b", {**AWQ, "modules_to_not_convert": names}) == "mlp=int4-g128,default=bf16"


def test_moe_checkpoints() -> None:
    # gpt-oss: MXFP4 experts, attention, router, embedding and head listed as not converted
    assert native("gpt-oss-20b", json.loads((FIXTURE_DIR / "gpt-oss-20b.json").read_text())
                  ["quantization_config"]) == "experts=mxfp4,default=bf16"
    # experts-only int4 (targets by regex), the rest of Qwen3-30B-A3B in bf16
    experts_only = ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
                      targets=["re:.*mlp.experts.*"])
    assert native("qwen3-30b-a3b", experts_only) == "experts=int4-g128-sym,default=bf16"
    # DeepSeek-V3 block fp8 with the dense layers' MLP, the shared experts and MLA attention all in fp8
    assert native("deepseek-v3", {"quant_method": "fp8", "weight_block_size": [128, 128]}) == "fp8_block"
    # Mixtral's checkpoint names its experts w1/w2/w3 under block_sparse_moe, transformers 5 fuses them under mlp:
    # a list in either naming means the same experts
    int4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}
    for pattern in ("re:.*block_sparse_moe.experts.*", "re:.*mlp.experts.*"):
        assert native("mixtral-8x7b", ct(int4, targets=[pattern])) == "experts=int4-g128-sym,default=bf16"
        assert native("mixtral-8x7b", ct(int4, ignore=["lm_head", pattern])) == \
            "attention=int4-g128-sym,default=bf16"
    assert native("mixtral-8x7b", {**AWQ, "modules_to_not_convert": ["gate"]}) == "int4-g128"  # router: 16-bit
    # Kimi K2 Thinking's layout on GLM-4.7-Flash (its shared experts under mlp.shared_experts, as DeepSeek's): the
    # routed experts alone are int4
    kimi_like = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"]
    assert native("glm-4.7-flash", ct(int4, ignore=kimi_like)) == "experts=int4-g128-sym,default=bf16"
    # Kimi K2 Thinking: Kimi K2's config with the int4 quantization_config Kimi K2.5 ships in its text_config
    thinking = json.loads((FIXTURE_DIR / "kimi-k2.5.json").read_text())["text_config"]["quantization_config"]
    assert native("kimi-k2", thinking) == "experts=int4-g32-sym,default=bf16"


@pytest.mark.parametrize(("quant", "message"), [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes 4-bit fp4 weights"),  # the default type
    ({"quant_method": "bitsandbytes"}, "bitsandbytes unsized weights have no tfcalc format"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "gptq with 3-bit weights has no tfcalc format"),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, r"group_size -1 has no tfcalc format .*int4-gN\)"),
    ({"quant_method": "awq", "bits": 4, "group_size": -1}, "group_size -1 has no tfcalc format"),
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, r"weight_block_size \[64, 64\] has no tfcalc format"),
    ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "quant_algo 'W4A8_AWQ' has no tfcalc format"),
    (ct({"num_bits": 4, "type": "int", "strategy": "channel"}), "strategy 'channel' have no tfcalc format"),
    ({"quant_method": "compressed-tensors", "config_groups": {}}, "config_groups must be a non-empty object"),
    ({**AWQ, "modules_to_not_convert": "lm_head"}, "modules_to_not_convert must be a list of module names"),
    (ct({"num_bits": 8, "type": "float", "strategy": "channel"}, targets="Linear"),  # type: ignore[arg-type]
     r"quantization_config.config_groups.group_0.targets must be a list of module names"),
    ({**AWQ, "modules_to_not_convert": ["re:("]}, "bad pattern"),
    ({"quant_method": "gptq", "bits": True, "group_size": 128}, "bits must be an integer"),
    ("fp8", "field 'quantization_config' must be an object"),
    ({**BNB, "load_in_4bit": False, "_load_in_4bit": False, "load_in_8bit": True},
     r"bitsandbytes 8-bit \(LLM.int8\) weights have no tfcalc format \(supported: 4-bit nf4\)"),
    # one expert's module excepted (routed experts are held whole or not at all, module by module they are not)
    ({**AWQ, "modules_to_not_convert": ["model.layers.0.mlp.experts.0.down_proj"]},
     r"stores part of the experts as int4-g128 \(model.layers.0.mlp.experts.0.gate_proj\) and part as unquantized "
     r"\(model.layers.0.mlp.experts.0.down_proj\) in one layer"),
])
def test_refused_with_one_line(quant: Any, message: str) -> None:
    name = "qwen3-30b-a3b" if "experts" in str(quant) else "llama3-8b"
    with pytest.raises(SpecError, match=message) as err:
        native(name, quant)
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{name}.json: ")


# --- against transformers: the module names, and the bytes ------------------------------------------------------

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NAMED_FIXTURES = ("llama3-8b", "phi3-mini", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "deepseek-v2-lite",
                  "deepseek-v3", "gpt-oss-20b", "glm-4.5-air", "glm-5", "deepseek-v3.2")


@functools.cache
def hf_modules(name: str) -> tuple[frozenset[str], tuple[tuple[str, tuple[int, ...]], ...]]:
    """(the module and parameter names, every parameter's shape) of the meta-device transformers model."""
    data = json.loads((FIXTURE_DIR / f"{name}.json").read_text(encoding="utf-8"))
    data.pop("quantization_config", None)
    model_type = data.pop("model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **data)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    names = {n for n, _ in model.named_modules()} | {n for n, _ in model.named_parameters()}
    return frozenset(names), tuple((n, tuple(p.shape)) for n, p in model.named_parameters())


@pytest.mark.parametrize("name", NAMED_FIXTURES)
def test_module_names_are_the_ones_transformers_builds(name: str) -> None:
    """Every name an exception list is matched against exists in the model, and every linear layer of a decoder
    layer (bar the router and the experts between the first and the last) is one of them."""
    data = json.loads((FIXTURE_DIR / f"{name}.json").read_text(encoding="utf-8"))
    spec = spec_from_hf_config(data, origin=name, name=name)
    built, params = hf_modules(name)
    ours = module_names(spec, data["model_type"])
    # transformers 5 builds the fused expert tensors; the per-expert names are the checkpoints' (and transformers
    # 4's), which the lists of quantization tools name
    fused = {n for c, namings in ours.items() for names in namings for n in names
             if c != "experts" or ".experts.gate_up_proj" in names[0]}
    listed = {n for namings in ours.values() for names in namings for n in names}
    assert fused <= built, sorted(fused - built)[:5]
    last = spec.moe.num_experts - 1 if spec.moe is not None else 0
    linear = {n.rsplit(".", 1)[0] for n, shape in params if len(shape) == 2 and n.startswith("model.layers.")
              and not any(k in n for k in (".gate.", ".router.", "shared_expert_gate", "norm"))}
    linear = {n for n in linear if not any(f".experts.{e}." in n + "." for e in range(1, last))}
    assert linear <= listed | {n.rsplit(".", 1)[0] for n in listed}, sorted(linear - listed)[:5]


def _brute_force_bytes(name: str, bits_per_quantized_weight: Fraction) -> Fraction:
    """Sum over transformers' parameters: the weight matrices of attention and MLP in every decoder layer at the
    quantized width, everything else (embedding, head, norms, router) at 2 bytes."""
    _, params = hf_modules(name)
    total = Fraction(0)
    for n, shape in params:
        numel = 1
        for d in shape:
            numel *= d
        quantized = (n.startswith("model.layers.") and n.endswith("proj.weight") and len(shape) == 2)
        total += numel * bits_per_quantized_weight / 8 if quantized else numel * 2
    return total


@pytest.mark.parametrize(("quant", "bits"), [
    (CT_FP8_CHANNEL, Fraction(8)),  # per-channel fp32 scales are not counted (tfcalc.dtypes)
    # AutoAWQ: qweight int32 [in, out/8], qzeros int32 [in/128, out/8], scales fp16 [in/128, out]
    (AWQ, Fraction(4) + Fraction(16 + 4, 128)),
    # bitsandbytes NF4 as vLLM holds it: two weights a byte and an fp32 absmax per 64 (double quantisation undone)
    (BNB, Fraction(4) + Fraction(32, 64)),
    # AutoGPTQ 8-bit: qweight int32 [in/4, out], qzeros int32 [in/128, out/4], scales fp16 [in/128, out]
    ({"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": True}, Fraction(8) + Fraction(16 + 8, 128)),
    # compressed-tensors pack-quantized, symmetric: weight_packed int32 [out, in/8], weight_scale bf16 [out, in/32]
    # (and a 2-element weight_shape per matrix, 16 bytes, not counted)
    (ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}), Fraction(4) + Fraction(16, 32)),
    # asymmetric: weight_zero_point int32 [out/8, in/128] besides
    (ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": False}),
     Fraction(4) + Fraction(16 + 4, 128)),
])
def test_weight_bytes_equal_a_count_over_the_checkpoint_layout(quant: dict, bits: Fraction) -> None:
    spec = spec_from_hf_config(config("llama3-8b", quant), origin="x", name="x")
    got = weights_bytes(count_params(spec), parse_weight_precision(spec.native_dtype))
    assert got == round(_brute_force_bytes("llama3-8b", bits))


# --- the KV cache format a checkpoint declares ------------------------------------------------------------------

# NVIDIA's ModelOpt checkpoints as they ship: hf_quant_config.json (ModelOpt <= 0.29, e.g.
# nvidia/Llama-3.1-70B-Instruct-FP8), config.json's quantization_config with a string scheme and no quant_method
# (Qwen3-32B-FP8-Static-PerTensor, ModelOpt 0.31) or with a scheme object (nvidia/Gemma-4-31B-IT-NVFP4, 0.37).
MODELOPT_SIDECAR = {"producer": {"name": "modelopt", "version": "0.23.0"},
                    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}
MODELOPT_INLINE = {"quant_algo": "FP8", "kv_cache_scheme": "FP8", "producer": {"name": "modelopt", "version": "0.31.0"},
                   "config_groups": {"group_0": {"weights": {"dynamic": False, "num_bits": 8, "type": "float"}}}}
MODELOPT_SCHEME = {"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": {"name": "modelopt"},
                   "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
                   "exclude_modules": ["lm_head"]}


def kv(quant: Any) -> str | None:
    return spec_from_hf_config(config("llama3-8b", quant), origin="llama3-8b.json", name="x").checkpoint_kv_dtype


@pytest.mark.parametrize(("quant", "weights", "cache"), [
    (MODELOPT_SIDECAR, "fp8_e4m3", "fp8"),
    (MODELOPT_INLINE, "fp8_e4m3", "fp8"),
    (MODELOPT_SCHEME, "nvfp4", "fp8"),
    ({**MODELOPT_SCHEME, "kv_cache_scheme": {"dynamic": True, "num_bits": 8, "type": "float"}}, "nvfp4", None),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}, "nvfp4", "nvfp4"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None}, "fp8_e4m3", None),
    ({**CT_FP8_CHANNEL, "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False}}, "fp8_e4m3", None),
    (None, "bf16", None),
])
def test_checkpoint_kv_format(quant: Any, weights: str, cache: str | None) -> None:
    """The weights and the KV format a ModelOpt config declares; a compressed-tensors kv_cache_scheme is not read
    (vLLM resolves --kv-cache-dtype auto from modelopt configs only), nor a scheme other than static fp8."""
    assert native("llama3-8b", quant) == weights
    assert kv(quant) == cache


def scale(quant: Any) -> str | None:
    return spec_from_hf_config(config("llama3-8b", quant), origin="llama3-8b.json",
                               name="x").checkpoint_activation_scale


@pytest.mark.parametrize(("quant", "expected"), [
    (MODELOPT_SIDECAR, "static"),  # ModelOpt FP8 calibrates its input scales
    (MODELOPT_SCHEME, None),  # NVFP4: no per-tensor fp8 linears
    ({"quant_method": "fp8", "activation_scheme": "static"}, "static"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "dynamic"),
    ({"quant_method": "fp8"}, "dynamic"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, None),
    (CT_FP8_CHANNEL, "dynamic"),  # RedHatAI's FP8-dynamic layout: input_activations.dynamic true
    ({**CT_FP8_CHANNEL, "config_groups": {"group_0": {**CT_FP8_CHANNEL["config_groups"]["group_0"],
                                                       "input_activations": {"num_bits": 8, "type": "float",
                                                                             "strategy": "tensor", "dynamic": False}}}},
     "static"),
    (AWQ, None),
    (None, None),
])
def test_checkpoint_activation_scale(quant: Any, expected: str | None) -> None:
    """How a checkpoint's per-tensor fp8 linears scale their inputs, where its config says (or implies) it."""
    assert scale(quant) == expected


def test_a_spec_takes_only_static_or_dynamic_scales() -> None:
    spec = spec_from_hf_config(config("llama3-8b", None), origin="llama3-8b.json", name="x")
    with pytest.raises(SpecError, match="x: checkpoint_activation_scale must be static or dynamic"):
        replace(spec, checkpoint_activation_scale="sometimes")


def test_unknown_activation_scheme_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError, match=r"activation_scheme 'per_token' is not static or dynamic") as exc:
        scale({"quant_method": "fp8", "activation_scheme": "per_token"})
    assert "\n" not in str(exc.value)


def test_unknown_kv_format_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError, match=r"kv_cache_quant_algo 'FP6' has no tfcalc KV format") as exc:
        kv({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP6"})
    assert "\n" not in str(exc.value)


def _llama4(quant: Any, layers: int | None = None) -> Any:
    data = config("llama4-maverick-17b-128e", quant)
    if layers is not None:
        data["text_config"] = {**data["text_config"], "num_hidden_layers": layers}
    return spec_from_hf_config(data, origin="llama4-maverick-17b-128e.json", name="m")


def _names_built_and_listed(spec: Any, name: str, model_type: str, text: dict[str, Any]
                            ) -> tuple[set[str], set[str], dict[str, Any]]:
    """The module and parameter names transformers builds for the fixture ``name`` (its text_config changed by
    ``text``, on the meta device), the names ``module_names`` lists (routed experts: the fused tensors transformers
    builds) and ``module_names`` itself."""
    data = config(name, None)
    data.pop("quantization_config")
    data["text_config"] = {**data["text_config"], **text}
    kind = data.pop("model_type")
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(transformers.AutoConfig.for_model(kind, **data))
    built = {n for n, _ in model.named_modules()} | {n for n, _ in model.named_parameters()}
    ours = module_names(spec, model_type)
    listed = {n for c, namings in ours.items() for names in namings for n in names
              if c != "experts" or ".experts.gate_up_proj" in names[0]}
    return built, listed, ours


def test_llama4_module_names_are_the_ones_transformers_builds() -> None:
    """Llama 4's checkpoints name the decoder language_model.model.layers.N and each block's FFN feed_forward."""
    spec = _llama4(None, layers=4)
    built, listed, ours = _names_built_and_listed(spec, "llama4-maverick-17b-128e", "llama4_text",
                                                  {"num_hidden_layers": 4})
    assert listed <= built, sorted(listed - built)[:5]
    assert "language_model.model.layers.0.feed_forward.gate_proj" in ours["mlp"][0]  # layer 0 is dense
    assert "language_model.model.layers.1.feed_forward.shared_expert.down_proj" in ours["shared_experts"][0]


def test_llama4_fbgemm_fp8_and_llm_compressor_checkpoints() -> None:
    """Meta's FP8 Maverick is written by fbgemm (per-channel fp8 weights, per-token dynamic inputs) with a
    modules_to_not_convert list; RedHat's FP8-dynamic Llama 4 by llm-compressor, ignoring attention by regex.
    (Both lists here are shaped like theirs, not copied: which modules Meta's keeps 16-bit is not at hand.)"""
    kept = ([f"language_model.model.layers.{i}.self_attn" for i in range(48)]
            + [f"language_model.model.layers.{i}.feed_forward" for i in range(0, 48, 2)]
            + [f"language_model.model.layers.{i}.feed_forward.shared_expert" for i in range(1, 48, 2)]
            + ["vision_model", "multi_modal_projector", "language_model.lm_head"])
    fbgemm = _llama4({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": kept})
    assert (fbgemm.native_dtype, fbgemm.checkpoint_activation_scale) == ("experts=fp8_e4m3,default=bf16", "dynamic")
    redhat = _llama4({**CT_FP8_CHANNEL, "ignore": ["re:.*lm_head", "re:.*self_attn", "re:.*router",
                                                   "re:.*vision_model", "re:.*multi_modal_projector"]})
    assert redhat.native_dtype == "mlp=fp8_e4m3,experts=fp8_e4m3,shared_experts=fp8_e4m3,default=bf16"
    assert redhat.checkpoint_activation_scale == "dynamic"
    # half the dense MLPs kept 16-bit: fp8 with those layers as exceptions, 12 layers x the MLP at 1 byte more
    half = _llama4({"quant_method": "fbgemm_fp8", "modules_to_not_convert": kept[48:60]})
    assert half.native_dtype == "fp8_e4m3"
    (exception,) = half.quantized_weight_exceptions
    assert (exception.layers, exception.components, exception.dtype) == (tuple(range(0, 24, 2)), ("mlp",), "bf16")
    precision = parse_weight_precision("fp8")
    plain = weights_bytes_by_component(count_params(half), precision)["mlp"]
    assert weights_bytes_by_component(count_params(half), precision, spec=half)["mlp"] == plain * 3 // 2
    # one module of one layer kept: that module alone, 5,120 x 5,120 weights at 1 byte more
    one = _llama4({"quant_method": "fbgemm_fp8",
                   "modules_to_not_convert": ["language_model.model.layers.0.self_attn.o_proj"]})
    (exception,) = one.quantized_weight_exceptions
    assert (exception.layers, exception.components, exception.modules) == ((0,), ("attention",), ("o_proj",))
    by_component = weights_bytes_by_component(count_params(one), precision, spec=one)
    assert by_component["attention"] - weights_bytes_by_component(count_params(one), precision)["attention"] == \
        5120 * 5120


def _gemma4(name: str, quant: Any, layers: int | None = None) -> Any:
    data = config(name, quant)
    if layers is not None:
        data["text_config"] = {**data["text_config"], "num_hidden_layers": layers,
                               "layer_types": data["text_config"]["layer_types"][:layers - 1] + ["full_attention"]}
    return spec_from_hf_config(data, origin=f"{name}.json", name="g")


def test_gemma4_module_names_are_the_ones_transformers_builds() -> None:
    """Gemma 4 names the decoder model.language_model.layers.N, the experts on the block beside its dense mlp."""
    spec = _gemma4("gemma4-26b-a4b", None, layers=4)
    types = [*config("gemma4-26b-a4b", None)["text_config"]["layer_types"][:3], "full_attention"]
    built, listed, ours = _names_built_and_listed(spec, "gemma4-26b-a4b", "gemma4_text",
                                                  {"num_hidden_layers": 4, "layer_types": types})
    # the k_eq_v global layer (3) has no v_proj: its name is listed for the checkpoint lists and built on the others
    missing = listed - built
    assert missing == {"model.language_model.layers.3.self_attn.v_proj"}, sorted(missing)[:5]
    assert "model.language_model.layers.0.mlp.down_proj" in ours["mlp"][0]  # the dense MLP of an MoE layer
    assert "model.language_model.layers.0.experts.gate_up_proj" in ours["experts"][-1]


def test_gemma4_modelopt_nvfp4_checkpoints_keep_attention_16_bit() -> None:
    """NVIDIA's Gemma-4-31B-IT-NVFP4 excludes every self_attn (and the vision tower), its 26B-A4B every module but
    the experts, by shell patterns on model.language_model.layers.N (the lists aiconfigurator 0.12 bundles)."""
    head = ["lm_head", "model.embed_vision*", "model.vision_tower*"]
    dense = _gemma4("gemma4-31b", {"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
                                   "exclude_modules": head + [f"model.language_model.layers.{i}.self_attn*"
                                                              for i in range(60)]})
    assert (dense.native_dtype, dense.checkpoint_kv_dtype) == ("mlp=nvfp4,default=bf16", "fp8")
    kept = [f"model.language_model.layers.{i}.{m}*" for i in range(30) for m in ("mlp", "router", "self_attn")]
    moe = _gemma4("gemma4-26b-a4b", {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                     "exclude_modules": head + kept})
    assert moe.native_dtype == "experts=nvfp4,default=bf16"


def _four_layers(data: dict[str, Any]) -> dict[str, Any]:
    """A hybrid config cut to its first four layers (and four experts), both kinds of mixer kept."""
    text = dict(data.get("text_config", data))
    if "hybrid_override_pattern" in text:  # Nemotron-H: M (Mamba-2), * (attention), - (MLP), E (experts)
        text["hybrid_override_pattern"] = "M*-E"
    if "layer_types" in text:
        text["layer_types"] = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    text["num_hidden_layers"] = 4
    for key in ("num_experts", "n_routed_experts"):
        if key in text:
            text[key] = 4
    if "num_experts_per_tok" in text:
        text["num_experts_per_tok"] = 2
    if "text_config" in data:
        return {**data, "text_config": text, "vision_config": {**data["vision_config"], "depth": 1}}
    return text


HYBRIDS = {"qwen3-next-80b-a3b": "model.layers.", "qwen3.5-27b": "model.language_model.layers.",
           "qwen3.5-35b-a3b": "model.language_model.layers.", "nemotron-3-nano-30b-a3b": "model.layers.",
           "nemotron-3-super-120b-a12b": "model.layers."}


@pytest.mark.parametrize("name", HYBRIDS)
def test_hybrid_module_names_are_the_ones_transformers_builds(name: str) -> None:
    """A hybrid's attention component lists each linear-attention layer's projections (Gated DeltaNet's or
    Mamba-2's) and each attention layer's; Qwen3.5's multimodal checkpoints name the decoder under
    language_model, Nemotron-H's under backbone (transformers 5 builds model.layers). Every listed name under the
    prefix transformers builds exists there, and every 2-D projection of a layer is listed, bar the per-head b/a
    projections and the latent MoE's, which are counted in their layer's format (``_GDN``)."""
    data = _four_layers(config(name, None))
    data.pop("quantization_config")
    spec = spec_from_hf_config(data, origin=name, name=name)
    model_type = data.pop("model_type")
    auto = transformers.AutoModelForImageTextToText if "vision_config" in data else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(transformers.AutoConfig.for_model(model_type, **data))
    built = {n for n, _ in model.named_modules()} | {n for n, _ in model.named_parameters()}
    family = "nemotron_h" if model_type == "nemotron_h" else ("qwen3_next" if model_type == "qwen3_next" else
                                                             f"{model_type}_text")
    ours = module_names(spec, family)
    prefix = HYBRIDS[name]
    listed = {n for c, namings in ours.items() for names in namings for n in names
              if n.startswith(prefix) or n == "lm_head"}
    listed = {n for n in listed if ".experts." not in n or n.rsplit(".", 1)[0].endswith("experts")}  # fused only
    assert listed <= built, sorted(listed - built)[:5]
    minor = ("in_proj_b", "in_proj_a", "in_proj_ba", "latent_proj", ".gate.", "shared_expert_gate", "norm", "conv1d")
    linear = {n.rsplit(".", 1)[0] for n, p in model.named_parameters()
              if p.dim() == 2 and n.startswith(prefix) and not any(k in n for k in minor)}
    assert linear <= listed, sorted(linear - listed)[:5]
    kinds = {n.split(".")[-2] for n in ours["attention"][0]}
    assert kinds == {"linear_attn", "self_attn"} if "qwen" in name else {"mixer"}


# --- ModelOpt's other algorithms and its per-layer (MIXED_PRECISION) checkpoints ----------------------------------


@pytest.mark.parametrize(("algo", "weights", "scale", "weight_only"), [
    ("FP8_PB_WO", "fp8_block", None, ()),  # 128x128 weight blocks, run as block-fp8 GEMMs
    ("fp8_pb_wo", "fp8_block", None, ()),  # ModelOpt may write it lower-case; vLLM upper-cases it
    ("FP8_PER_CHANNEL_PER_TOKEN", "fp8_e4m3", "dynamic", ()),
    ("W4A16_NVFP4", "nvfp4", None, ("attention", "mlp")),
])
def test_modelopt_algorithms(algo: str, weights: str, scale: str | None, weight_only: tuple[str, ...]) -> None:
    spec = spec_from_hf_config(config("llama3-8b", {"quant_method": "modelopt", "quant_algo": algo,
                                                    "exclude_modules": ["lm_head"]}), origin="x", name="x")
    assert (spec.native_dtype, spec.checkpoint_activation_scale, spec.checkpoint_weight_only) == (
        weights, scale, weight_only)


def test_a_modelopt_algorithm_without_a_format_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError, match=r"quant_algo 'W4A8_AWQ' has no tfcalc format \(supported: FP8, .*"
                                        r"MIXED_PRECISION\)") as info:
        native("llama3-8b", {"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"})
    assert "\n" not in str(info.value)
    with pytest.raises(SpecError, match="quantized_layers must map module names"):
        native("llama3-8b", {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"})
    with pytest.raises(SpecError, match=r"quantized_layers.model.layers.0.mlp.up_proj.quant_algo 'INT8_SQ'"):
        native("llama3-8b", {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                             "quantized_layers": {"model.layers.0.mlp.up_proj": {"quant_algo": "INT8_SQ"}}})


QWEN36 = "qwen3.6-27b-nvfp4"  # nvidia/Qwen3.6-27B-NVFP4's config.json as aiconfigurator 0.12 bundles it


def test_mixed_precision_checkpoint_reads_each_layers_algorithm() -> None:
    """nvidia/Qwen3.6-27B-NVFP4 names 401 modules: every attention projection (Gated DeltaNet's and softmax's) FP8,
    every MLP and the output head W4A16_NVFP4; what it does not name (the embedding, the vision tower, the per-head
    b/a projections) stays bf16. Its hf_quant_config.json (``quantization``, no config_groups) reads the same."""
    data = json.loads((FIXTURE_DIR / f"{QWEN36}.json").read_text())
    spec = spec_from_hf_config(data, origin=QWEN36, name=QWEN36)
    assert spec.native_dtype == "attention=fp8_e4m3,mlp=nvfp4,lm_head=nvfp4,default=bf16"
    assert (spec.checkpoint_weight_only, spec.checkpoint_activation_scale, spec.checkpoint_kv_dtype) == (
        ("mlp", "lm_head"), "static", "fp8")
    quant = data["quantization_config"]
    sidecar = {"producer": quant["producer"], "quantization": {
        "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8", "exclude_modules": quant["ignore"],
        "quantized_layers": quant["quantized_layers"]}}
    other = spec_from_hf_config({**data, "quantization_config": sidecar}, origin=QWEN36, name=QWEN36)
    assert other == spec
    # a layer the list names nothing of is left in bf16: its attention splits, which one format cannot hold
    del quant["quantized_layers"]["model.language_model.layers.5.linear_attn.in_proj_z"]
    with pytest.raises(SpecError, match=r"part of the attention as fp8 \(.*\) and part as unquantized "
                                        r"\(.*layers.5.linear_attn.in_proj_z\)"):
        spec_from_hf_config({**data, "quantization_config": quant}, origin=QWEN36, name=QWEN36)


def test_mixed_precision_bytes_equal_a_count_over_the_modules_transformers_builds() -> None:
    """The weights of nvidia/Qwen3.6-27B-NVFP4 summed over transformers' parameters (meta device), each module at
    the width its quantized_layers entry gives (FP8 8 bits, NVFP4 4.5 with its fp8 scale per 16), the rest 16
    bits: tfcalc's total matches to within the per-head b/a projections it counts at their layer's 8 bits, which
    the checkpoint keeps at 16 (48 layers x 2 x 48 heads x 5,120 bytes)."""
    data = json.loads((FIXTURE_DIR / f"{QWEN36}.json").read_text())
    spec = spec_from_hf_config(data, origin=QWEN36, name=QWEN36)
    layers = data.pop("quantization_config")["quantized_layers"]
    kind = data.pop("model_type")
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(transformers.AutoConfig.for_model(kind, **data))
    bits = {"FP8": Fraction(8), "W4A16_NVFP4": Fraction(9, 2)}
    total = Fraction(0)
    for name, p in model.named_parameters():
        entry = layers.get(name.removesuffix(".weight")) if name.endswith(".weight") else None
        total += p.numel() * (bits[entry["quant_algo"]] if entry else Fraction(16)) / 8
    ours = weights_bytes(count_params(spec), parse_weight_precision(spec.native_dtype))
    gap = 48 * 2 * 48 * 5120
    assert ours == total - gap, float(ours - total)


def test_layers_kept_16_bit_are_exceptions_weighed_by_their_own_shape() -> None:
    """An FP8 Nemotron-H checkpoint (ModelOpt, named backbone.layers.N.mixer) keeping every attention layer and
    the Mamba-2 layer before each one in bf16, as NVIDIA's Nemotron-3-Nano FP8 release does: the attention
    component is fp8 with those 12 layers as a bf16 exception, each weighed by its own shape (Mamba-2's or the
    softmax attention's). The bytes equal a sum over the modules transformers builds (model.layers.N)."""
    name = "nemotron-3-nano-30b-a3b"
    pattern = config(name, None)["hybrid_override_pattern"]
    kept_layers = [i for i, k in enumerate(pattern) if k == "*" or (k == "M" and pattern[i + 1:i + 2] == "*")]
    quant = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
             "exclude_modules": ["lm_head", *(f"backbone.layers.{i}.mixer*" for i in kept_layers)]}
    spec = spec_from_hf_config(config(name, quant), origin=name, name=name)
    assert spec.native_dtype == "fp8_e4m3"
    (exception,) = spec.quantized_weight_exceptions
    assert (exception.layers, exception.components, exception.dtype) == (tuple(kept_layers), ("attention",), "bf16")
    ours = sum(weights_bytes_by_component(count_params(spec), parse_weight_precision("fp8"), spec=spec).values())
    data = config(name, None)
    data.pop("quantization_config")
    kind = data.pop("model_type")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(kind, **data))
    total = 0
    for n, p in model.named_parameters():
        parts = n.split(".")
        quantized = (n.startswith("model.layers.") and int(parts[2]) not in kept_layers and p.dim() >= 2
                     and not any(k in n for k in ("conv1d", ".gate.", "norm")))
        total += p.numel() * (1 if quantized else 2)
    # the router's score-correction bias is a buffer there (a 16-bit vector here, as every router vector)
    total += sum(b.numel() * 2 for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert ours == total


def test_bitsandbytes_skip_list_keeps_whole_layers_16_bit() -> None:
    """unsloth's dynamic 4-bit checkpoints skip a few whole modules (llm_int8_skip_modules, matched by dotted parts
    as vLLM's BitsAndBytesLinearMethod does): the first layer's MLP kept 16-bit is an exception of that layer."""
    spec = spec_from_hf_config(config("llama3-8b", {**BNB, "llm_int8_skip_modules": ["lm_head",
                                                                                      "model.layers.0.mlp"]}),
                               origin="x", name="x")
    assert spec.native_dtype == "nf4"
    (kept,) = spec.quantized_weight_exceptions
    assert (kept.layers, kept.components, kept.dtype, kept.formats) == ((0,), ("mlp",), "bf16", ("nf4",))


@pytest.mark.parametrize(("quant", "weights", "weight_only"), [
    # RedHatAI's NVFP4A16 (llm-compressor): fp4 weights, no input_activations -> vLLM CompressedTensorsW4A16Fp4
    (ct({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}), "nvfp4",
     ("attention", "mlp")),
    # FP8 weight-only (W8A16: CompressedTensorsW8A16Fp8)
    (ct({"num_bits": 8, "type": "float", "strategy": "channel"}), "fp8_e4m3", ("attention", "mlp")),
    (CT_FP8_CHANNEL, "fp8_e4m3", ()),  # FP8-dynamic: its inputs are quantised too (W8A8)
    (ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}), "int4-g128-sym", ()),  # int: always
])
def test_compressed_tensors_float_weights_without_quantised_inputs_run_weight_only(
        quant: dict, weights: str, weight_only: tuple[str, ...]) -> None:
    spec = spec_from_hf_config(config("llama3-8b", quant), origin="x", name="x")
    assert (spec.native_dtype, spec.checkpoint_weight_only) == (weights, weight_only)


def test_mla_projections_kept_beside_a_quantized_o_proj() -> None:
    """NVIDIA's DeepSeek-V3.2-NVFP4 (ModelOpt, hf_quant_config.json as aiconfigurator bundles it) excludes, in every
    layer, MLA's q_a / q_b / kv_a / kv_b projections and the indexer, leaving o_proj nvfp4 with the FFNs: the
    attention is nvfp4 with those modules as a bf16 exception. Its bytes equal a sum over transformers' attention
    parameters (norms aside) at those widths: o_proj 4.5 bits a weight, the rest 16."""
    name = "deepseek-v3.2"
    layers = config(name, None)["num_hidden_layers"]
    kept = [f"model.layers.{i}.self_attn.{m}" for i in range(layers)
            for m in ("indexer*", "kv_a_proj_with_mqa", "kv_b_proj", "q_a_proj", "q_b_proj")]
    quant = {"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16, "exclude_modules": ["lm_head", *kept]}}
    spec = spec_from_hf_config(config(name, quant), origin=name, name=name)
    assert spec.native_dtype == "nvfp4" and spec.checkpoint_kv_dtype == "fp8"
    (exception,) = spec.quantized_weight_exceptions
    assert exception.modules == ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "indexer.wq_b",
                                 "indexer.wk", "indexer.weights_proj") and exception.layers == tuple(range(layers))
    _, params = hf_modules(name)
    expected = Fraction(0)
    for n, shape in params:
        if ".self_attn." in n and "norm" not in n:
            numel = math.prod(shape)
            expected += numel * (Fraction(9, 16) if ".o_proj." in n else 2)
    ours = weights_bytes_by_component(count_params(spec), parse_weight_precision("nvfp4"), spec=spec)["attention"]
    assert ours == math.ceil(expected)
