"""A checkpoint's ``quantization_config`` -> the weight format of each component (``ModelSpec.native_dtype``).

A quantized checkpoint's config.json says how its linear layers are stored; ignoring it prices an FP8 or AWQ
checkpoint as bf16, about 2x or 3.5x its real size. Each method is read the way the library that wrote it
and the engines that load it do:

- ``fp8`` (transformers FineGrainedFP8 / vLLM Fp8Config): ``weight_block_size`` [128, 128] -> fp8_block, none ->
  per-tensor fp8; exceptions in ``modules_to_not_convert`` / ``ignored_layers``.
- ``compressed-tensors`` (llm-compressor): each ``config_groups`` entry's ``weights`` scheme for the modules its
  ``targets`` match (``Linear`` = every linear layer); exceptions in ``ignore`` (names or ``re:`` patterns).
- ``awq`` / ``gptq``: ``bits`` 4 or 8 with ``group_size`` G -> int4-gG / int8-gG (8 bits per channel: int8);
  exceptions in ``modules_to_not_convert``;
  GPTQ's ``lm_head: true`` quantizes the output head too.
- ``modelopt`` (NVIDIA TensorRT Model Optimizer): ``quant_algo`` FP8, FP8_PER_CHANNEL_PER_TOKEN (fp8), FP8_PB_WO
  (fp8_block), NVFP4 and W4A16_NVFP4 (nvfp4; the latter's 16-bit activations: ``checkpoint_weight_only``), or
  MIXED_PRECISION, whose ``quantized_layers`` give each module (or module prefix) its algorithm and leave the
  modules they do not name 16-bit; exceptions in ``exclude_modules`` / ``ignore``; its ``kv_cache_quant_algo``
  is the KV cache format the checkpoint declares (``checkpoint_kv_dtype``).
- ``mxfp4`` (gpt-oss): the experts only.
- ``fbgemm_fp8`` (transformers FbgemmFp8Config / vLLM FBGEMMFp8Config: Meta's Llama 4 Maverick FP8): per-channel
  fp8 weights (a scale per output row, negligible beside them: fp8) with per-token dynamic activation scales;
  exceptions in ``modules_to_not_convert``.
- ``bitsandbytes``: 4-bit NF4 -> nf4 (as vLLM holds it); exceptions in ``llm_int8_skip_modules``.

Whatever the method, the embedding, router and norms stay 16-bit, and so does the output head unless named
(engines build them without a quantized method: tfcalc.dtypes.KEPT_16_BIT). An exception list matches the
module names transformers gives the model (``model.layers.3.self_attn.q_proj``; ``module_names``): ``re:``
entries as regular expressions (``re.match``), entries with ``*`` as shell patterns, others as whole dotted parts
of a name. A component stored in different formats layer by layer (the first and last layers kept 16-bit, the
Mamba-2 layer before each attention layer) takes the format of most of its layers, the others becoming
``ModelSpec.quantized_weight_exceptions``; one layer's modules stored in different formats are refused, as is any
method or scheme with no tfcalc format (bitsandbytes' FP4 and 8-bit, 3-bit GPTQ), so a number is never silently
bf16.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from tfcalc.dtypes import parse_weight_precision
from tfcalc.errors import SpecError, UsageError
from tfcalc.spec.model import LAYER_MODULES, ModelSpec, WeightException

# The components a quantization method can convert (tfcalc.dtypes.PARAM_COMPONENTS that are linear layers).
QUANTIZABLE = ("attention", "mlp", "experts", "shared_experts", "lm_head")
SUPPORTED_METHODS = ("awq", "bitsandbytes", "compressed-tensors", "fbgemm_fp8", "fp8", "gptq", "modelopt", "mxfp4")
_MAX_ENTRIES = 100_000  # exception and target lists (a checkpoint may name every layer's module)
_MAX_PATTERNS = 1_000  # regular expressions and shell patterns among them (each is tried on every module name)

# Module names (below the decoder's layer prefix) of each component, as transformers names them per model type.
_ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_EXPERT = ("gate_proj", "up_proj", "down_proj")
_MOE_PREFIX = {"mixtral": "block_sparse_moe", "minimax_m3": "block_sparse_moe", "kimi_linear": "block_sparse_moe"}
_EXPERT_NAMES = {"mixtral": ("w1", "w2", "w3"), "minimax_m3": ("w1", "w2", "w3"), "kimi_linear": ("w1", "w2", "w3"),
                 "nemotron_h": ("up_proj", "down_proj")}
_SHARED_NAMES = {"nemotron_h": ("up_proj", "down_proj")}  # Nemotron-H's FFNs are ungated (relu2)
_SHARED_PREFIX = {"qwen2_moe": "mlp.shared_expert", "deepseek_v2": "mlp.shared_experts",
                  "deepseek_v3": "mlp.shared_experts", "deepseek_v32": "mlp.shared_experts",
                  "glm4_moe": "mlp.shared_experts", "glm_moe_dsa": "mlp.shared_experts",
                  "glm4_moe_lite": "mlp.shared_experts", "minimax_m3": "block_sparse_moe.shared_experts",
                  "llama4_text": "feed_forward.shared_expert", "nemotron_h": "mixer.shared_experts",
                  "kimi_linear": "block_sparse_moe.shared_experts"}
# The decoder's layers by the names checkpoints give them, first the one transformers builds. Llama 4's and
# Gemma 4's name it under language_model; other multimodal checkpoints one of three ways, by the transformers
# release that wrote them (Qwen3.5's model.language_model, Qwen2.5-VL's model, Gemma 3's and Mistral 3's
# language_model.model before 4.52), so all are listed (``_MULTIMODAL_LAYERS``); Nemotron-H's name it backbone.
_LAYERS = {"llama4_text": ("language_model.model.layers.",), "gemma4_text": ("model.language_model.layers.",),
           "nemotron_h": ("backbone.layers.", "model.layers.")}
_MULTIMODAL_LAYERS = ("model.language_model.layers.", "model.layers.", "language_model.model.layers.")
# each block's FFN (Llama 4: feed_forward; Nemotron-H's blocks hold one mixer, an MLP or the experts as well)
_FFN = {"llama4_text": "feed_forward", "nemotron_h": "mixer"}
_MLP = {"phi3": ("mlp.gate_up_proj", "mlp.down_proj"), "nemotron_h": ("mixer.up_proj", "mixer.down_proj")}
_ATTENTION_AT = {"phi3": ("self_attn.qkv_proj", "self_attn.o_proj"),
                 "nemotron_h": ("mixer.q_proj", "mixer.k_proj", "mixer.v_proj", "mixer.o_proj")}
# Linear-attention layers' projections. Gated DeltaNet's per-head b and a projections (in_proj_ba; Qwen3.5's
# in_proj_b and in_proj_a: one output per value head, under 1 % of a layer's weights, which FP8 and NVFP4
# checkpoints leave 16-bit) are not listed: they are counted in the layer's format whatever the checkpoint stores.
_GDN = {"qwen3_next": ("linear_attn.in_proj_qkvz", "linear_attn.out_proj"),
        "qwen3_5_text": ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj")}
_GDN["qwen3_5_moe_text"] = _GDN["qwen3_5_text"]
# Kimi Linear's KDA (its checkpoints' names): q, k, v and o; the low-rank gates and b (under 2 % of a layer) not listed
_GDN["kimi_linear"] = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_MAMBA = ("mixer.in_proj", "mixer.out_proj")
# A DSA layer's lightning indexer (DeepSeek-V3.2, GLM-5), part of the attention component
_INDEXER = ("self_attn.indexer.wq_b", "self_attn.indexer.wk", "self_attn.indexer.weights_proj")
# MiniMax-M3's MSA indexer as its checkpoints name it (transformers' MiniMaxM3VLIndexer: self_attn.indexer.q_proj)
_MSA_INDEXER = ("self_attn.index_q_proj", "self_attn.index_k_proj")
# Gemma 4 keeps its experts and router on the block itself (layers.N.experts), beside the dense mlp of every layer
_EXPERTS_AT = {"gemma4_text": ""}
# Nemotron-H's latent MoE projects into and out of the experts' width (fc1/fc2_latent_proj, counted with the
# experts: under 1 % of a layer's expert weights, not listed, like the b/a projections above)
_HEAD = {"llama4_text": "language_model.lm_head"}


def module_names(spec: ModelSpec, model_type: str) -> dict[str, tuple[tuple[str, ...], ...]]:
    """The linear modules of each quantizable component, by their transformers names: one tuple per naming a
    checkpoint's lists may use. The decoder's layers may be named more than one way (``_LAYERS``), and routed
    experts two ways: the checkpoint's own (one module per expert, Mixtral's under ``block_sparse_moe`` as
    w1/w2/w3; the first and the last expert of each layer stand for all) and the fused per-layer tensors of
    transformers 5 (``mlp.experts.gate_up_proj``), which gpt-oss checkpoints use too. A hybrid model's attention
    component lists its linear-attention layers' projections (Gated DeltaNet, Mamba-2) for those layers."""
    if spec.mla is not None:
        q = ("self_attn.q_a_proj", "self_attn.q_b_proj") if spec.mla.q_lora_rank else ("self_attn.q_proj",)
        attention: tuple[str, ...] = (*q, "self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj", "self_attn.o_proj")
    else:
        attention = _ATTENTION_AT.get(model_type, _ATTENTION)
    linear = _MAMBA if spec.linear_attention is not None and spec.linear_attention.kind == "mamba2" else \
        _GDN.get(model_type, ())
    ffn = _FFN.get(model_type, "mlp")
    mlp = _MLP.get(model_type, tuple(f"{ffn}.{n}" for n in _EXPERT))
    experts_at = _EXPERTS_AT.get(model_type, f"{ffn}.")
    prefix = _EXPERTS_AT.get(model_type, f"{_MOE_PREFIX.get(model_type, ffn)}.")
    expert_names = _EXPERT_NAMES.get(model_type, _EXPERT)
    fused_names = ("up_proj", "down_proj") if model_type == "nemotron_h" else ("gate_up_proj", "down_proj")
    dense = set(spec.moe.dense_layers) if spec.moe is not None else set(range(spec.num_layers))
    beside = spec.moe is not None and spec.moe.dense_mlp_beside
    indexed = set(spec.sparse_indexer.layers) if spec.sparse_indexer is not None else set()
    layer_prefixes = _LAYERS.get(model_type) or (_MULTIMODAL_LAYERS if spec.encoder is not None else
                                                 ("model.layers.",))
    namings: dict[str, list[tuple[str, ...]]] = {}
    for layers in layer_prefixes:
        out: dict[str, list[str]] = {c: [] for c in (*QUANTIZABLE, "fused_experts")}
        for i in range(spec.num_layers):
            base = f"{layers}{i}."
            if spec.has_mixer(i):
                out["attention"] += [base + n for n in (linear if spec.is_linear_layer(i) else attention)]
            if i in indexed:
                out["attention"] += [base + n for n in (_MSA_INDEXER if spec.sparse_indexer.kind == "minimax_m3"
                                                        else _INDEXER)]
            if not spec.has_ffn(i):
                continue
            if i in dense or beside:
                out["mlp"] += [base + n for n in mlp]
            if i in dense or spec.moe is None:
                continue
            out["fused_experts"] += [f"{base}{experts_at}experts.{n}" for n in fused_names]
            if model_type != "gpt_oss":
                for e in sorted({0, spec.moe.num_experts - 1}):
                    out["experts"] += [f"{base}{prefix}experts.{e}.{n}" for n in expert_names]
            if spec.moe.num_shared_experts:
                shared = _SHARED_PREFIX.get(model_type, "mlp.shared_expert")
                out["shared_experts"] += [f"{base}{shared}.{n}" for n in _SHARED_NAMES.get(model_type, _EXPERT)]
        out["lm_head"] = [_HEAD.get(model_type, "lm_head")] if not spec.tie_word_embeddings else []
        fused = tuple(out.pop("fused_experts"))
        for c, n in out.items():
            if n:
                namings.setdefault(c, []).append(tuple(n))
        if fused:
            namings.setdefault("experts", []).append(fused)
    return {c: tuple(dict.fromkeys(n)) for c, n in namings.items()}


class _Patterns:
    """An exception or target list: ``re:`` regular expressions, ``*`` shell patterns, or dotted name parts."""

    def __init__(self, entries: Sequence[str], field: str, origin: str) -> None:
        self.plain: set[str] = set()
        self.regexes: list[tuple[str, re.Pattern[str]]] = []
        self.globs: list[str] = []
        for entry in entries:
            if entry.startswith("re:"):
                try:
                    self.regexes.append((entry, re.compile(entry[3:])))
                except re.error as exc:
                    raise SpecError(f"{origin}: quantization_config.{field}: bad pattern {entry!r:.60}: {exc}") \
                        from None
            elif "*" in entry:
                self.globs.append(entry)
            else:
                self.plain.add(entry)
        if len(self.regexes) + len(self.globs) > _MAX_PATTERNS:
            raise SpecError(f"{origin}: quantization_config.{field} holds more than {_MAX_PATTERNS:,} patterns")
        # every shell pattern in one expression (a checkpoint may list one per layer: hundreds, tried on each name)
        self.any_glob = re.compile("|".join(fnmatch.translate(g) for g in self.globs)) if self.globs else None

    def match(self, name: str) -> str | None:
        """The first entry that names ``name`` (or a module it belongs to), else None."""
        parts = name.split(".")
        if self.plain:  # every run of whole dotted parts of the name
            for i in range(len(parts)):
                for j in range(i + 1, len(parts) + 1):
                    run = ".".join(parts[i:j])
                    if run in self.plain:
                        return run
        for entry, pattern in self.regexes:
            if pattern.match(name):
                return entry
        if self.any_glob is not None:
            prefixes = [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
            if any(self.any_glob.match(p) for p in prefixes):
                return next(entry for entry in self.globs if any(fnmatch.fnmatchcase(p, entry) for p in prefixes))
        return None


def _strings(quant: Mapping[str, Any], field: str, origin: str, where: str = "") -> list[str]:
    value = quant.get(field)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > _MAX_ENTRIES or not all(isinstance(v, str) and v.isprintable()
                                                                          for v in value):
        raise SpecError(f"{origin}: quantization_config.{where}{field} must be a list of module names")
    return value


def _bits(quant: Mapping[str, Any], field: str, origin: str, where: str = "") -> int | None:
    value = quant.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
        raise SpecError(f"{origin}: quantization_config.{where}{field} must be an integer from 1 to 64, "
                        f"got {value!r:.40}")
    return value


def _group_format(bits: int | None, group: Any, what: str, origin: str, zero_point: bool = True) -> str:
    """AWQ / GPTQ / compressed-tensors integer weights: 4 or 8 bits in groups of G -> int4-gG / int8-gG (-sym where
    the checkpoint stores no zero point); 8 bits per output channel (GPTQ's group_size -1) -> int8."""
    if bits not in (4, 8):
        raise SpecError(f"{origin}: quantization_config: {what} with {bits}-bit weights has no tfcalc format "
                        "(supported: 4- and 8-bit groups, int4-gN / int8-gN)")
    if bits == 8 and group == -1:
        return "int8"
    if isinstance(group, bool) or not isinstance(group, int) or not 8 <= group <= 8192 or group & (group - 1):
        raise SpecError(f"{origin}: quantization_config: {what} group_size {group!r:.40} has no tfcalc format "
                        f"(supported: a power-of-two group of 8 to 8,192 input channels, int{bits}-gN)")
    return f"int{bits}-g{group}" + ("" if zero_point else "-sym")


def _compressed_scheme(weights: Any, group: str, origin: str) -> str:
    """A compressed-tensors ``weights`` scheme -> a tfcalc format name."""
    where = f"config_groups.{group}.weights."
    if not isinstance(weights, Mapping):
        raise SpecError(f"{origin}: quantization_config.{where[:-1]} must be an object")
    bits, kind = _bits(weights, "num_bits", origin, where), weights.get("type")
    strategy, size, block = weights.get("strategy"), weights.get("group_size"), weights.get("block_structure")
    if kind == "float" and bits == 8:
        if strategy == "block" or block is not None:
            if block == [128, 128]:
                return "fp8_block"
            raise SpecError(f"{origin}: quantization_config.{where}block_structure {block!r:.40} has no tfcalc "
                            "format (supported: [128, 128], fp8_block)")
        return "fp8"
    if kind == "float" and bits == 4 and strategy in ("group", "tensor_group") and size in (16, 32):
        return "nvfp4" if size == 16 else "mxfp4"
    if kind == "int" and bits == 8 and strategy in ("channel", "tensor"):
        return "int8"
    if kind == "int" and bits in (4, 8) and strategy == "group":  # QuantizationArgs.symmetric defaults to true
        symmetric = weights.get("symmetric", True)
        if not isinstance(symmetric, bool):
            raise SpecError(f"{origin}: quantization_config.{where}symmetric must be true or false")
        return _group_format(bits, size, "compressed-tensors", origin, zero_point=not symmetric)
    raise SpecError(f"{origin}: quantization_config.{where[:-1]}: {kind} {bits}-bit weights with strategy "
                    f"{strategy!r:.20} have no tfcalc format (supported: fp8, fp8 128x128 blocks, int8 per "
                    "channel, int4 and int8 groups, fp4 groups of 16 or 32)")


# ModelOpt's weight algorithms as vLLM serves them (vllm/model_executor/layers/quantization/modelopt.py QUANT_ALGOS):
# per-tensor FP8 with static input scales; per-channel FP8 with per-token dynamic ones; FP8_PB_WO's 128x128 weight
# blocks (run as block-fp8 GEMMs); NVFP4 W4A4, and W4A16_NVFP4 (16-bit activations: a weight-only kernel)
_MODELOPT_FORMATS = {"FP8": "fp8", "FP8_PER_CHANNEL_PER_TOKEN": "fp8", "FP8_PB_WO": "fp8_block", "NVFP4": "nvfp4",
                     "MXFP8": "mxfp8",
                     "W4A16_NVFP4": "nvfp4"}
_MODELOPT_SCALES = {"FP8": "static", "FP8_PER_CHANNEL_PER_TOKEN": "dynamic"}
_MIXED = "MIXED_PRECISION"


def _modelopt_algo(value: Any, origin: str, where: str = "quant_algo") -> str:
    """A ModelOpt ``quant_algo``, upper-cased as vLLM reads it; one without a tfcalc format is refused."""
    algo = value.upper() if isinstance(value, str) else None
    if algo not in _MODELOPT_FORMATS:
        raise SpecError(f"{origin}: quantization_config.{where} {value!r:.40} has no tfcalc format "
                        f"(supported: {', '.join([*_MODELOPT_FORMATS, _MIXED])})")
    return algo


def _modelopt_layers(quant: Mapping[str, Any], origin: str) -> dict[str, str]:
    """A MIXED_PRECISION checkpoint's ``quantized_layers``: each module (or module prefix) -> its ModelOpt algorithm;
    modules it does not name are left unquantized (vLLM ModelOptMixedPrecisionConfig)."""
    layers = quant.get("quantized_layers")
    if not isinstance(layers, Mapping) or not layers or len(layers) > _MAX_ENTRIES:
        raise SpecError(f"{origin}: quantization_config.quantized_layers must map module names to their quant_algo "
                        "(a MIXED_PRECISION checkpoint)")
    out = {}
    for name, entry in layers.items():
        algo = entry.get("quant_algo") if isinstance(entry, Mapping) else None
        out[str(name)] = _modelopt_algo(algo, origin, f"quantized_layers.{name!s:.60}.quant_algo")
    return out


def _modelopt_targets(quant: Mapping[str, Any], origin: str) -> list[tuple[_Patterns | None, str, str]]:
    """(modules covered, None = every linear layer; tfcalc format; ModelOpt algorithm) of a ModelOpt config."""
    algo = quant.get("quant_algo")
    if isinstance(algo, str) and algo.upper() == _MIXED:
        by_algo: dict[str, list[str]] = {}
        for name, layer_algo in _modelopt_layers(quant, origin).items():
            by_algo.setdefault(layer_algo, []).append(name)
        return [(_Patterns(names, "quantized_layers", origin), _MODELOPT_FORMATS[a], a) for a, names in by_algo.items()]
    algo = _modelopt_algo(algo, origin)
    return [(None, _MODELOPT_FORMATS[algo], algo)]


def _bnb_format(quant: Mapping[str, Any], origin: str) -> str:
    """bitsandbytes: 4-bit NF4 (``load_in_4bit``, ``bnb_4bit_quant_type`` nf4) -> nf4; its FP4 type and 8-bit
    LLM.int8 (outlier columns multiplied apart) have no tfcalc format or kernel model."""
    four = quant.get("load_in_4bit", quant.get("_load_in_4bit"))
    kind = quant.get("bnb_4bit_quant_type", "fp4")  # transformers BitsAndBytesConfig's default
    if four is True and kind == "nf4":
        return "nf4"
    eight = quant.get("load_in_8bit", quant.get("_load_in_8bit"))
    what = f"4-bit {kind!s:.20}" if four is True else "8-bit (LLM.int8)" if eight is True else "unsized"
    raise SpecError(f"{origin}: quantization_config: bitsandbytes {what} weights have no tfcalc format "
                    "(supported: 4-bit nf4)")


def _method(quant: Mapping[str, Any]) -> Any:
    """``quant_method``, or the one a config that names none was written by: ModelOpt's (``producer.name``; vLLM
    ModelConfig._parse_quant_hf_config sets it the same way), early DeepSeek-V3's (``fmt: e4m3``: fp8)."""
    method = quant.get("quant_method")
    producer = quant.get("producer")
    if method is None and isinstance(producer, Mapping) and producer.get("name") == "modelopt":
        return "modelopt"
    if method is None and isinstance(quant.get("quantization"), Mapping) and "quant_algo" in quant["quantization"]:
        return "modelopt"  # hf_quant_config.json's layout (ModelOpt's own file) without its producer block
    if method is None and quant.get("fmt") == "e4m3":
        return "fp8"
    return method


_MODELOPT_KV = {"FP8": "fp8", "NVFP4": "nvfp4", "INT8": "int8"}


def _modelopt_fields(quant: Mapping[str, Any]) -> Mapping[str, Any]:
    """A ModelOpt config's fields, hf_quant_config.json's ``quantization`` nesting flattened (its values first)."""
    nested = quant.get("quantization")
    return {**quant, **nested} if isinstance(nested, Mapping) else quant


def checkpoint_kv_dtype(quant: Any, origin: str) -> str | None:
    """The KV cache format a ModelOpt ``quantization_config`` declares, or None: its ``kv_cache_scheme`` of static
    8-bit floats (fp8; another scheme: none) or ``kv_cache_quant_algo`` (FP8, NVFP4, INT8; null = none), read where
    and in the order vLLM reads them (vllm/utils/torch_utils.py get_kv_cache_quant_algo_string)."""
    if not isinstance(quant, Mapping) or _method(quant) != "modelopt":
        return None
    fields = _modelopt_fields(quant)
    declared = fields.get("kv_cache_scheme") or fields.get("kv_cache_quant_algo")
    if isinstance(declared, Mapping):  # any other scheme: vLLM warns and keeps the model dtype
        fp8 = declared.get("num_bits") == 8 and declared.get("type") == "float" and declared.get("dynamic") is False
        return "fp8" if fp8 else None
    if declared is None:
        return None
    if isinstance(declared, str) and declared.upper() in _MODELOPT_KV:
        return _MODELOPT_KV[declared.upper()]
    raise SpecError(f"{origin}: quantization_config.kv_cache_quant_algo {declared!r:.40} has no tfcalc KV format "
                    f"(supported: {', '.join(_MODELOPT_KV)}, or a static 8-bit float kv_cache_scheme)")


def checkpoint_activation_scale(quant: Any, origin: str) -> str | None:
    """How a checkpoint's per-tensor fp8 linear layers scale their inputs: ``static`` or ``dynamic``, or None where
    it has no such layers. ModelOpt FP8: static (calibrated input scales); vLLM's ``fp8`` method:
    ``activation_scheme`` (dynamic when absent; block-scale checkpoints quantise per group inside the kernel:
    None); compressed-tensors: the fp8 groups' ``input_activations.dynamic``."""
    if not isinstance(quant, Mapping):
        return None
    method = _method(quant)
    if method == "modelopt":  # the first per-tensor fp8 algorithm among its layers
        scales = [_MODELOPT_SCALES[a] for _, _, a in _modelopt_targets(_modelopt_fields(quant), origin)
                  if a in _MODELOPT_SCALES]
        return scales[0] if scales else None
    if method == "fbgemm_fp8":  # FBGEMMFp8LinearMethod: per-token dynamic input scales
        return "dynamic"
    if method == "fp8":
        if quant.get("weight_block_size") is not None:
            return None
        scheme = quant.get("activation_scheme", "dynamic")
        if scheme not in ("static", "dynamic"):
            raise SpecError(f"{origin}: quantization_config.activation_scheme {scheme!r:.40} is not static or "
                            "dynamic")
        return scheme
    if method == "compressed-tensors" and isinstance(quant.get("config_groups"), Mapping):
        for key, group in quant["config_groups"].items():
            if not isinstance(group, Mapping) or _compressed_scheme(group.get("weights"), str(key), origin) != "fp8":
                continue
            inputs = group.get("input_activations")
            if isinstance(inputs, Mapping) and isinstance(inputs.get("dynamic"), bool):
                return "dynamic" if inputs["dynamic"] else "static"
    return None


def checkpoint_weight_only(quant: Any, spec: ModelSpec, model_type: str, origin: str) -> tuple[str, ...]:
    """The components whose float weights (fp8, fp4) the checkpoint pairs with 16-bit activations, which engines run
    in a weight-only kernel on any GPU: ModelOpt's W4A16_NVFP4 (vLLM ModelOptNvFp4W4A16LinearMethod) and a
    compressed-tensors group of float weights without ``input_activations`` (vLLM CompressedTensorsW4A16Fp4,
    CompressedTensorsW8A16Fp8: RedHatAI's NVFP4A16 and FP8 weight-only checkpoints), but for the routed experts of an
    MXFP4 group (float, 4 bits, groups of 32): vLLM's compressed-tensors MoE takes them by their weights alone
    (compressed_tensors_moe.py get_moe_method: ``_is_mxfp4(weight_quant)`` -> CompressedTensorsW4A4Mxfp4MoEMethod,
    which never reads input_activations; CUTLASS W4A4 on SM100) and SGLang's Kimi K3 MXFP4 MoE quantises their
    inputs to MXFP8 on Blackwell (aiconfigurator sdk/models/helpers.py resolve_kimi_k3_moe_arch_mode); () for any
    other."""
    if not isinstance(quant, Mapping):
        return ()
    method = _method(quant)
    # (modules covered, None = every linear; weight-only; an MXFP4 group, whose routed experts are not)
    targets: list[tuple[_Patterns | None, bool, bool]] = []
    if method == "modelopt":
        targets = [(covered, a == "W4A16_NVFP4", False)
                   for covered, _, a in _modelopt_targets(_modelopt_fields(quant), origin)]
    elif method == "compressed-tensors" and isinstance(quant.get("config_groups"), Mapping):
        for key, group in quant["config_groups"].items():
            if not isinstance(group, Mapping):
                continue
            weights = group.get("weights")
            covered = _strings(group, "targets", origin, f"config_groups.{key}.") or ["Linear"]
            floats = isinstance(weights, Mapping) and weights.get("type") == "float"
            mxfp4 = floats and weights.get("num_bits") == 4 and weights.get("group_size") == 32
            targets.append((None if "Linear" in covered else _Patterns(covered, "targets", origin),
                            floats and group.get("input_activations") is None, mxfp4))
    if not any(only for _, only, _ in targets):
        return ()
    names = module_names(spec, model_type)

    def first_target(name: str, component: str) -> bool:
        return next((only and not (mxfp4 and component == "experts") for covered, only, mxfp4 in targets
                     if covered is None or covered.match(name)), False)

    return tuple(c for c in QUANTIZABLE
                 if c in names and any(first_target(naming[0], c) for naming in names[c]))


class CheckpointWeights(NamedTuple):
    """How a checkpoint stores its weights: a format per component (``tfcalc.dtypes.parse_weight_precision``) and
    the layers of a component it keeps in another format (``ModelSpec.quantized_weight_exceptions``)."""

    precision: str
    exceptions: tuple[WeightException, ...] = ()


def checkpoint_precision(quant: Any, spec: ModelSpec, model_type: str, base: str, origin: str) -> CheckpointWeights:
    """The weight formats a checkpoint with this ``quantization_config`` stores, for a model whose unquantized
    weights are ``base``."""
    if quant is None:
        return CheckpointWeights(base)
    if not isinstance(quant, Mapping):
        raise SpecError(f"{origin}: field 'quantization_config' must be an object")
    method = _method(quant)
    if method == "modelopt":
        quant = _modelopt_fields(quant)
    names = module_names(spec, model_type)
    targets: list[tuple[_Patterns | None, str]] = []  # (modules it covers, None = every linear layer; format)
    exceptions: list[str] = []
    field = "modules_to_not_convert"
    if method == "fp8":
        block = quant.get("weight_block_size")
        if block is not None and block != [128, 128]:
            raise SpecError(f"{origin}: quantization_config.weight_block_size {block!r:.40} has no tfcalc format "
                            "(supported: [128, 128], fp8_block)")
        targets = [(None, "fp8_block" if block else "fp8")]
        exceptions = _strings(quant, field, origin) + _strings(quant, "ignored_layers", origin)
    elif method in ("awq", "gptq"):
        targets = [(None, _group_format(_bits(quant, "bits", origin), quant.get("group_size"), method, origin))]
        exceptions = _strings(quant, field, origin)
    elif method == "compressed-tensors":
        groups = quant.get("config_groups")
        if not isinstance(groups, Mapping) or not groups:
            raise SpecError(f"{origin}: quantization_config.config_groups must be a non-empty object")
        for key, group in groups.items():
            if not isinstance(group, Mapping):
                raise SpecError(f"{origin}: quantization_config.config_groups.{key} must be an object")
            covered = _strings(group, "targets", origin, f"config_groups.{key}.") or ["Linear"]
            fmt = _compressed_scheme(group.get("weights"), str(key), origin)
            targets.append((None if "Linear" in covered else _Patterns(covered, f"config_groups.{key}.targets",
                                                                       origin), fmt))
        field = "ignore"
        exceptions = _strings(quant, field, origin)
    elif method == "modelopt":
        targets = [(covered, fmt) for covered, fmt, _ in _modelopt_targets(quant, origin)]
        field = "exclude_modules"
        exceptions = _strings(quant, field, origin) + _strings(quant, "ignore", origin)
    elif method == "bitsandbytes":
        targets = [(None, _bnb_format(quant, origin))]
        field = "llm_int8_skip_modules"
        exceptions = _strings(quant, field, origin)
    elif method == "fbgemm_fp8":
        targets = [(None, "fp8")]
        exceptions = _strings(quant, field, origin)
    elif method == "mxfp4":
        targets = [(_Patterns(["re:.*experts"], "experts", origin), "mxfp4")]
        exceptions = _strings(quant, field, origin)
    else:
        raise SpecError(f"{origin}: quantization_config.quant_method {method!r:.40} is not supported (supported: "
                        f"{', '.join(SUPPORTED_METHODS)})")
    excepted = _Patterns(exceptions, field, origin)
    formats: dict[str, str | None] = {}
    kept: list[WeightException] = []
    hybrid = spec.linear_attention is not None or spec.full_attention is not None  # modules of one layer kind
    for c in names:
        formats[c], others = _component_format(c, names[c], targets, excepted, origin,
                                               modules_apart=c == "mlp" or (c == "attention" and not hybrid))
        kept += [WeightException(layers=layers, components=(c,), dtype=fmt or base, formats=(str(formats[c]),),
                                 modules=modules) for fmt, layers, modules in others]
    if method == "gptq" and quant.get("lm_head") is True and "lm_head" in names:
        formats["lm_head"] = targets[0][1]
    elif "lm_head" in formats and not (method == "modelopt" and targets[0][0] is not None):  # a mixed one names it
        formats["lm_head"] = None  # engines keep the output head 16-bit (see the module docstring)
    return CheckpointWeights(_precision(formats, base, origin), tuple(kept))


_LAYER = re.compile(r"layers\.(\d+)\.")


# (format, layers, modules: () for the whole component) a component keeps apart from its main format
Others = list[tuple[str | None, tuple[int, ...], tuple[str, ...]]]


def _component_format(component: str, namings: Sequence[Sequence[str]],
                      targets: Sequence[tuple[_Patterns | None, str]], excepted: _Patterns, origin: str,
                      modules_apart: bool = False) -> tuple[str | None, Others]:
    """The format a component's modules are stored in (None: left in the base dtype), under the naming the
    checkpoint's lists were written in (the one in which an entry names a module, else any), and the layers (or,
    where ``modules_apart``, the modules of layers) stored in another format (``_split``)."""
    results: list[tuple[bool, str | None, Others]] = []  # (named, format, others)
    refusal, refused_named = None, False
    for names in namings:
        seen: dict[str | None, list[str]] = {}
        named = False
        for name in names:
            fmt, covered = (None, True) if excepted.match(name) else _target_format(name, targets)
            named = named or covered
            seen.setdefault(fmt, []).append(name)
        split = _split(component, seen, modules_apart) if len(seen) > 1 else (next(iter(seen)), [])
        if split is not None:
            results.append((named, *split))
        elif refusal is None or (named and not refused_named):
            refusal, refused_named = _split_error(component, seen, origin), named
    chosen = [(fmt, others) for named, fmt, others in results if named]
    if refusal is not None and (refused_named and not chosen or not results):  # the naming the lists use splits it
        raise refusal
    return (chosen or [(fmt, others) for _, fmt, others in results])[0]


_MODULE_PREFIXES = ("self_attn.", "mlp.", "mixer.", "feed_forward.")


def _split(component: str, seen: Mapping[str | None, Sequence[str]], modules_apart: bool
           ) -> tuple[str | None, Others] | None:
    """A component stored in several formats: (the quantized format of the most of its modules, what is stored
    otherwise), as checkpoints keep their first or last layers 16-bit (whole layers), or MLA's down- and
    up-projections beside a quantized o_proj (modules, where ``modules_apart`` and each is one of
    ``LAYER_MODULES``); None where a split cannot be held that way (a module of no layer, other modules)."""
    by_layer: dict[int, dict[str, str | None]] = {}
    counts: dict[str | None, int] = {}
    for fmt, names in seen.items():
        counts[fmt] = counts.get(fmt, 0) + len(names)
        for name in names:
            match = _LAYER.search(name)
            if match is None:
                return None
            module = name[match.end():]
            for prefix in _MODULE_PREFIXES:
                module = module.removeprefix(prefix)
            by_layer.setdefault(int(match.group(1)), {})[module] = fmt
    main = max(counts, key=lambda f: (f is not None, counts[f]))
    groups: dict[tuple[str | None, tuple[str, ...]], list[int]] = {}
    for layer, modules in sorted(by_layer.items()):
        apart = {m: f for m, f in modules.items() if f != main}
        if not apart:
            continue
        if len(apart) == len(modules) and len(set(apart.values())) == 1:  # the whole layer in another format
            groups.setdefault((next(iter(apart.values())), ()), []).append(layer)
            continue
        if not modules_apart or not set(apart) <= set(LAYER_MODULES.get(component, ())):
            return None
        for fmt in dict.fromkeys(apart.values()):
            groups.setdefault((fmt, tuple(m for m, f in apart.items() if f == fmt)), []).append(layer)
    return main, [(fmt, tuple(layers), modules) for (fmt, modules), layers in groups.items()]


def _split_error(component: str, seen: Mapping[str | None, Sequence[str]], origin: str) -> SpecError:
    """The refusal of a component whose modules within one layer are stored in different formats."""
    layers: dict[str, dict[str | None, str]] = {}
    for fmt, names in seen.items():
        for name in names:
            match = _LAYER.search(name)
            layers.setdefault(match.group(0) if match else name, {}).setdefault(fmt, name)
    pair = next((list(f.items()) for f in layers.values() if len(f) > 1), None) or \
        [(fmt, names[0]) for fmt, names in list(seen.items())[:2]]
    (a, first), (b, second) = pair[:2]
    return SpecError(f"{origin}: quantization_config stores part of the {component} as {a or 'unquantized'} "
                     f"({first}) and part as {b or 'unquantized'} ({second}) in one layer; tfcalc holds one format "
                     "per component of a layer")


def _target_format(name: str, targets: Sequence[tuple[_Patterns | None, str]]) -> tuple[str | None, bool]:
    """(the format of the first target covering ``name``, whether a named pattern rather than 'Linear' did)."""
    for covered, fmt in targets:
        if covered is None:
            return fmt, False
        if covered.match(name):
            return fmt, True
    return None, False


def _precision(formats: Mapping[str, str | None], base: str, origin: str) -> str:
    """``fmt`` when every quantizable component is in it, else ``component=fmt,...,default=base``."""
    linear = {c: f for c, f in formats.items() if c != "lm_head"}
    values = set(linear.values())
    head = formats.get("lm_head")
    if len(values) == 1 and None not in values:
        (fmt,) = values
        text = fmt if head is None else f"default={fmt},lm_head={head}"
    else:
        parts = [f"{c}={f}" for c, f in formats.items() if f is not None]
        text = ",".join([*parts, f"default={base}"]) if parts else base
    try:
        return parse_weight_precision(text).label  # canonical names, as a weights option compares them
    except UsageError as exc:
        raise SpecError(f"{origin}: quantization_config: {exc}") from None

