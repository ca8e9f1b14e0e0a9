"""A checkpoint's ``quantization_config`` -> the weight format of each component (``ModelSpec.native_dtype``).

A quantized checkpoint's config.json says how its linear layers are stored; ignoring it prices an FP8 or AWQ
checkpoint as bf16, about 2x or 3.5x its real size. Each method is read the way the library that wrote it
and the engines that load it do:

- ``fp8`` (transformers FineGrainedFP8 / vLLM Fp8Config): ``weight_block_size`` [128, 128] -> fp8_block, none ->
  per-tensor fp8; exceptions in ``modules_to_not_convert`` / ``ignored_layers``.
- ``compressed-tensors`` (llm-compressor): each ``config_groups`` entry's ``weights`` scheme for the modules its
  ``targets`` match (``Linear`` = every linear layer); exceptions in ``ignore`` (names or ``re:`` patterns).
- ``awq`` / ``gptq``: ``bits`` 4 with ``group_size`` G -> int4-gG; exceptions in ``modules_to_not_convert``;
  GPTQ's ``lm_head: true`` quantizes the output head too.
- ``modelopt`` (NVIDIA TensorRT Model Optimizer): ``quant_algo`` FP8 / NVFP4; exceptions in ``exclude_modules``;
  its ``kv_cache_quant_algo`` is the KV cache format the checkpoint declares (``checkpoint_kv_dtype``).
- ``mxfp4`` (gpt-oss): the experts only.
- ``fbgemm_fp8`` (transformers FbgemmFp8Config / vLLM FBGEMMFp8Config: Meta's Llama 4 Maverick FP8): per-channel
  fp8 weights (a scale per output row, negligible beside them: fp8) with per-token dynamic activation scales;
  exceptions in ``modules_to_not_convert``.

Whatever the method, the embedding, router and norms stay 16-bit, and so does the output head unless named
(engines build them without a quantized method: tfcalc.dtypes.KEPT_16_BIT). An exception list matches the
module names transformers gives the model (``model.layers.3.self_attn.q_proj``): ``re:`` entries as regular
expressions (``re.match``), entries with ``*`` as shell patterns, others as whole dotted parts of a name. A
component some of whose modules are excepted and some not has no single format: that is refused, as is any
method or scheme with no tfcalc format (bitsandbytes' NF4, 8-bit GPTQ), so a number is never silently bf16.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tfcalc.dtypes import parse_weight_precision
from tfcalc.errors import SpecError, UsageError
from tfcalc.spec.model import ModelSpec

# The components a quantization method can convert (tfcalc.dtypes.PARAM_COMPONENTS that are linear layers).
QUANTIZABLE = ("attention", "mlp", "experts", "shared_experts", "lm_head")
SUPPORTED_METHODS = ("awq", "compressed-tensors", "fbgemm_fp8", "fp8", "gptq", "modelopt", "mxfp4")
_MAX_ENTRIES = 100_000  # exception and target lists (a checkpoint may name every layer's module)
_MAX_PATTERNS = 1_000  # regular expressions and shell patterns among them (each is tried on every module name)

# Module names (below ``model.layers.{i}.``) of each component, as transformers names them per model type.
_ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_EXPERT = ("gate_proj", "up_proj", "down_proj")
_MOE_PREFIX = {"mixtral": "block_sparse_moe"}
_EXPERT_NAMES = {"mixtral": ("w1", "w2", "w3")}
_SHARED_PREFIX = {"qwen2_moe": "mlp.shared_expert", "deepseek_v2": "mlp.shared_experts",
                  "deepseek_v3": "mlp.shared_experts", "llama4_text": "feed_forward.shared_expert"}
# Llama 4's checkpoints name the decoder under language_model. and each block's FFN feed_forward (its experts fused,
# or one Linear per expert in llm-compressor's checkpoints)
_LAYERS = {"llama4_text": "language_model.model.layers.", "gemma4_text": "model.language_model.layers."}
_FFN = {"llama4_text": "feed_forward"}
# Gemma 4 keeps its experts and router on the block itself (layers.N.experts), beside the dense mlp of every layer
_EXPERTS_AT = {"gemma4_text": ""}
_HEAD = {"llama4_text": "language_model.lm_head"}


def module_names(spec: ModelSpec, model_type: str) -> dict[str, tuple[tuple[str, ...], ...]]:
    """The linear modules of each quantizable component, by their transformers names: one tuple per naming a
    checkpoint's lists may use. Routed experts have two: the checkpoint's own (one module per expert, Mixtral's
    under ``block_sparse_moe`` as w1/w2/w3; the first and the last expert of each layer stand for all) and the
    fused per-layer tensors of transformers 5 (``mlp.experts.gate_up_proj``), which gpt-oss checkpoints use too."""
    layers = range(spec.num_layers)
    dense = set(spec.moe.dense_layers) if spec.moe is not None else set(layers)
    if spec.mla is not None:
        q = ("self_attn.q_a_proj", "self_attn.q_b_proj") if spec.mla.q_lora_rank else ("self_attn.q_proj",)
        attention: tuple[str, ...] = (*q, "self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj", "self_attn.o_proj")
    elif model_type == "phi3":
        attention = ("self_attn.qkv_proj", "self_attn.o_proj")
    else:
        attention = _ATTENTION
    ffn = _FFN.get(model_type, "mlp")
    mlp = ("mlp.gate_up_proj", "mlp.down_proj") if model_type == "phi3" else tuple(
        f"{ffn}.{n}" for n in _EXPERT)
    out: dict[str, list[str]] = {c: [] for c in (*QUANTIZABLE, "fused_experts")}
    beside = spec.moe is not None and spec.moe.dense_mlp_beside
    experts_at = _EXPERTS_AT.get(model_type, f"{ffn}.")
    for i in layers:
        base = f"{_LAYERS.get(model_type, 'model.layers.')}{i}."
        out["attention"] += [base + n for n in attention]
        if i in dense or beside:
            out["mlp"] += [base + n for n in mlp]
        if i in dense or spec.moe is None:
            continue
        out["fused_experts"] += [f"{base}{experts_at}experts.gate_up_proj", f"{base}{experts_at}experts.down_proj"]
        if model_type != "gpt_oss":
            prefix = _EXPERTS_AT.get(model_type, f"{_MOE_PREFIX.get(model_type, ffn)}.")
            for e in sorted({0, spec.moe.num_experts - 1}):
                out["experts"] += [f"{base}{prefix}experts.{e}.{n}" for n in _EXPERT_NAMES.get(model_type, _EXPERT)]
        if spec.moe.num_shared_experts:
            shared = _SHARED_PREFIX.get(model_type, "mlp.shared_expert")
            out["shared_experts"] += [f"{base}{shared}.{n}" for n in _EXPERT]
    out["lm_head"] = [_HEAD.get(model_type, "lm_head")] if not spec.tie_word_embeddings else []
    fused = tuple(out.pop("fused_experts"))
    names = {c: (tuple(n),) for c, n in out.items() if n}
    if fused:
        names["experts"] = (*names.get("experts", ()), fused)
    return names


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
        if self.globs:
            prefixes = [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
            for entry in self.globs:
                if any(fnmatch.fnmatchcase(p, entry) for p in prefixes):
                    return entry
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


def _group_format(bits: int | None, group: Any, what: str, origin: str) -> str:
    """AWQ / GPTQ / compressed-tensors integer weights: 4 bits in groups of G -> int4-gG."""
    if bits != 4:
        raise SpecError(f"{origin}: quantization_config: {what} with {bits}-bit weights has no tfcalc format "
                        "(supported: 4-bit groups, int4-gN)")
    if isinstance(group, bool) or not isinstance(group, int) or not 8 <= group <= 8192 or group & (group - 1):
        raise SpecError(f"{origin}: quantization_config: {what} group_size {group!r:.40} has no tfcalc format "
                        "(supported: a power-of-two group of 8 to 8,192 input channels, int4-gN)")
    return f"int4-g{group}"


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
    if kind == "int" and bits == 4 and strategy == "group":
        return _group_format(bits, size, "compressed-tensors", origin)
    raise SpecError(f"{origin}: quantization_config.{where[:-1]}: {kind} {bits}-bit weights with strategy "
                    f"{strategy!r:.20} have no tfcalc format (supported: fp8, fp8 128x128 blocks, int8 per "
                    "channel, int4 groups, fp4 groups of 16 or 32)")


def _modelopt_format(quant: Mapping[str, Any], origin: str) -> str:
    algo = quant.get("quant_algo")
    formats = {"FP8": "fp8", "NVFP4": "nvfp4"}
    if not isinstance(algo, str) or algo not in formats:
        raise SpecError(f"{origin}: quantization_config.quant_algo {algo!r:.40} has no tfcalc format "
                        f"(supported: {', '.join(formats)})")
    return formats[algo]


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
    if method == "modelopt":
        return "static" if _modelopt_fields(quant).get("quant_algo") == "FP8" else None
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


def checkpoint_precision(quant: Any, spec: ModelSpec, model_type: str, base: str, origin: str) -> str:
    """The weight format string (``tfcalc.dtypes.parse_weight_precision``) a checkpoint with this
    ``quantization_config`` stores, for a model whose unquantized weights are ``base``."""
    if quant is None:
        return base
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
        targets = [(None, _modelopt_format(quant, origin))]
        field = "exclude_modules"
        exceptions = _strings(quant, field, origin) + _strings(quant, "ignore", origin)
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
    formats = {c: _component_format(c, names[c], targets, excepted, origin) for c in names}
    if method == "gptq" and quant.get("lm_head") is True and "lm_head" in names:
        formats["lm_head"] = targets[0][1]
    elif "lm_head" in formats:
        formats["lm_head"] = None  # engines keep the output head 16-bit (see the module docstring)
    return _precision(formats, base, origin)


def _component_format(component: str, namings: Sequence[Sequence[str]],
                      targets: Sequence[tuple[_Patterns | None, str]], excepted: _Patterns, origin: str) -> str | None:
    """The one format all of a component's modules are stored in (None: left in the base dtype), under the naming
    the checkpoint's lists were written in: the one in which an entry names a module, else any."""
    results: list[tuple[bool, str | None]] = []  # (an entry named one of its modules, format)
    refusal = None
    for names in namings:
        seen: dict[str | None, str] = {}
        named = False
        for name in names:
            fmt, covered = (None, True) if excepted.match(name) else _target_format(name, targets)
            named = named or covered
            seen.setdefault(fmt, name)
        if len(seen) == 1:
            results.append((named, next(iter(seen))))
        elif refusal is None:
            (a, first), (b, second) = list(seen.items())[:2]
            refusal = SpecError(f"{origin}: quantization_config stores part of the {component} as "
                                f"{a or 'unquantized'} ({first}) and part as {b or 'unquantized'} ({second}); "
                                "tfcalc holds one format per component")
    if not results:  # every naming splits the component
        assert refusal is not None
        raise refusal
    chosen = [fmt for named, fmt in results if named] or [fmt for _, fmt in results]
    return chosen[0]


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

