"""Parameter counts equal what Hugging Face transformers builds, to the single parameter.

Every ``tests/fixtures/hf_configs/*.json`` is instantiated with transformers on the meta device (no memory is
allocated, so DeepSeek-V3 builds in about a second) and compared with ``count_params`` of the spec that
``load_hf_config`` reads from the same file: the total, every component (split into matrix and vector
elements), and the per-layer structure (MoE vs dense layers, sliding windows, head_dim). For the fixtures
that mirror a bundled preset, the preset must give the same total, the same KV-relevant fields and, in fact, the
same value for every ModelSpec field but the name and a quantized checkpoint's exceptions.

One difference is expected and asserted explicitly: DeepSeek-V3's router ``e_score_correction_bias`` is a
persistent ``nn.Buffer`` in transformers (saved in the checkpoint, so ``count_params`` counts it), not an
``nn.Parameter``, so ``model.parameters()`` misses it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch  # noqa: TID251 - test-only comparison with transformers
from transformers import (
    CONFIG_MAPPING,
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    Gemma3ForCausalLM,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from tfcalc.calc.params import count_params
from tfcalc.dtypes import PARAM_COMPONENTS
from tfcalc.spec.hf_config import (
    FAMILIES,
    KIMI_K25_VISION_DEFAULTS,
    LLAMA4_VISION_DEFAULTS,
    MULTIMODAL,
    PIXTRAL_DEFAULTS,
    QWEN2_5_VL_DEFAULTS,
    QWEN3_5_VISION_DEFAULTS,
    QWEN3_VL_VISION_DEFAULTS,
    SIGLIP_DEFAULTS,
    load_hf_config,
    spec_from_hf_config,
)
from tfcalc.spec.model import ModelSpec
from tfcalc.spec.presets import load_model

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
# Remote-code families transformers has no class for (DeciLM's nemotron-nas): counted against a brute-force count of
# their block_configs in tests/spec/test_hf_config_nas.py instead; Kimi K3 (kimi_k3), against one from vLLM's code in
# tests/spec/test_hf_config_kimi.py
WITHOUT_TRANSFORMERS = {"llama-3.3-nemotron-super-49b-v1": "nemotron-nas", "kimi-k3": "kimi_k3"}
FIXTURES = sorted(p.stem for p in FIXTURE_DIR.glob("*.json") if p.stem not in WITHOUT_TRANSFORMERS)
PRESET_FIXTURES = (
    "llama3-8b", "llama3.1-8b", "llama3-70b", "llama3.1-405b", "llama3.2-1b", "llama3.2-3b", "mistral-7b",
    "mixtral-8x7b", "mixtral-8x22b", "qwen2.5-7b", "qwen2.5-72b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gemma2-9b",
    "gemma2-27b", "deepseek-v3", "phi3-mini", "gpt-oss-20b", "gpt-oss-120b", "glm-4.6", "glm-4.5-air", "minimax-m2.5",
    "gemma3-27b", "qwen3-next-80b-a3b", "qwen3.5-27b", "qwen3.5-35b-a3b", "qwen3.5-122b-a10b", "qwen3.5-397b-a17b",
    "llama4-scout-17b-16e", "llama4-maverick-17b-128e", "gemma4-31b", "gemma4-26b-a4b", "deepseek-v3.2", "glm-5",
    "nemotron-3-nano-30b-a3b", "nemotron-h-56b", "kimi-k2.5", "mimo-v2-flash", "deepseek-v4-flash",
    "deepseek-v4-pro", "qwen3-8b", "qwen3-32b", "qwen3-coder-480b-a35b", "kimi-k2", "nemotron-3-super-120b-a12b",
    "mistral-small-3.2-24b", "mistral-nemo-12b", "minimax-m2.7", "qwen3-14b", "qwen3-4b", "qwen3-1.7b", "qwen3-0.6b",
    "phi-4", "qwen2.5-32b", "qwen2.5-14b", "minimax-m3", "kimi-linear-48b-a3b", "nemotron-3-ultra-550b-a55b", "glm-5.2",
)
# Presets of the families without a transformers class: the preset and its WITHOUT_TRANSFORMERS fixture
PRESETS_WITHOUT_TRANSFORMERS = {"llama-3.3-nemotron-super-49b": "llama-3.3-nemotron-super-49b-v1"}
# Checkpoints whose config.json equals a bundled preset's but for metadata: the fixture, that preset, and the repository
# id (an alias of it) that names the checkpoint.
ALIAS_FIXTURES = {
    "deepseek-r1": ("deepseek-v3", "deepseek-ai/DeepSeek-R1"),
    "glm-5.1": ("glm-5", "zai-org/GLM-5.1"),
    "glm-5.3": ("glm-5.2", "zai-org/GLM-5.3"),
    "llama3.1-70b": ("llama3-70b", "meta-llama/Meta-Llama-3.1-70B"),
}
# Attention modules that read ``config.sliding_window`` on every layer instead of holding a per-layer window.
_CONFIG_WIDE_WINDOW = {"mistral", "mixtral", "phi3"}


@dataclass(frozen=True)
class HFModel:
    """What one meta-device transformers model holds (summarised; the model itself is dropped)."""

    class_name: str
    params: tuple[tuple[str, tuple[int, ...]], ...]   # named_parameters(): tied weights appear once
    buffers: tuple[tuple[str, tuple[int, ...]], ...]  # persistent buffers: saved in checkpoints like weights
    moe_layers: tuple[int, ...]
    windows: tuple[int | None, ...]                    # sliding window per layer, None for full attention
    head_dims: tuple[int, ...]
    rotary_dim: int | None                             # dimensions RoPE turns (None: no single rotary table)
    qk_norm: bool
    linear_layers: tuple[int, ...]                     # Gated DeltaNet layers
    tied: bool
    seconds: float

    @property
    def param_numel(self) -> int:
        return sum(_numel(shape) for _, shape in self.params)

    @property
    def buffer_numel(self) -> int:
        return sum(_numel(shape) for _, shape in self.buffers)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


_UNCOUNTED_BUFFERS = (".layer_scalar", "vision_tower.std_bias", "vision_tower.std_scale")


def _config(name: str) -> dict:
    return json.loads((FIXTURE_DIR / f"{name}.json").read_text(encoding="utf-8"))


# Model types whose transformers reference is another class: MiMo-7B's remote-code MiMoConfig is a Qwen2Config (no
# mimo class in transformers; its MTP layer is not part of Qwen2ForCausalLM, nor of tfcalc's count); aiconfigurator's
# flat Step-3.7-Flash copy is the text_config of transformers' multimodal Step3p7Config (Step3p7TextConfig, model type
# step3p5), built as Step3p7TextModel plus an untied lm_head (_step3p7_text_model); MiniMax-M3's decoder is
# transformers' MiniMaxM3VLTextConfig, whose causal LM is MiniMaxM3VLForCausalLM
_REFERENCE_TYPE = {"mimo": "qwen2", "step3p7": "step3p5", "minimax_m3": "minimax_m3_vl_text"}
_REFERENCE_CLASS = {"mimo": "Qwen2ForCausalLM", "step3p7": "Step3p7TextModel", "minimax_m3": "MiniMaxM3VLForCausalLM"}
# aiconfigurator's names in the flat Step-3.7 copy -> Step3p7TextConfig's (which would otherwise take its defaults)
_STEP3P7_KEYS = {"num_experts": "n_routed_experts"}


def _transformers_type(cfg: dict) -> str:
    """The config's model type, or for a remote-code one (Kimi K2's kimi_k2) the built-in type whose causal-LM class
    its architectures[0] names, by transformers' own auto mapping; ``_REFERENCE_TYPE``'s reference where it has one."""
    if cfg["model_type"] in _REFERENCE_TYPE:
        return _REFERENCE_TYPE[cfg["model_type"]]
    if cfg["model_type"] in CONFIG_MAPPING:
        return cfg["model_type"]
    by_class = {cls: kind for kind, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()}
    return by_class[cfg["architectures"][0]]


@functools.cache
def hf_model(name: str) -> HFModel:
    cfg = _config(name)
    model_type = _transformers_type(cfg)
    cfg.pop("model_type")
    if "text_config" in cfg and "tie_word_embeddings" not in cfg:
        # transformers 5 ties a multimodal model's output head by the top-level flag (Mistral3Config: True by
        # default); vLLM and transformers 4 build the decoder from text_config and tie by its flag, as tfcalc does
        text = cfg["text_config"]
        cfg["tie_word_embeddings"] = text["tie_word_embeddings"] if "tie_word_embeddings" in text else \
            CONFIG_MAPPING[text["model_type"]]().tie_word_embeddings
    start = time.perf_counter()
    if model_type == "step3p5":
        cfg = _step3p7_fields(cfg)
    config = AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        if model_type == "step3p5":
            model = _step3p7_text_model(config)
        elif model_type == "gemma3_text":
            model = Gemma3ForCausalLM(config)
        elif "vision_config" in cfg:  # a multimodal checkpoint: its ...ForConditionalGeneration
            model = AutoModelForImageTextToText.from_config(config)
        else:
            model = AutoModelForCausalLM.from_config(config)
    seconds = time.perf_counter() - start
    # ERNIE 4.5 holds its router's score-correction bias as a frozen nn.Parameter (moe_statics), DeepSeek-V3 as a buffer
    param_names = {n for n, _ in model.named_parameters(remove_duplicate=False)
                   if not n.endswith(".e_score_correction_bias")}
    # Gemma 4's per-layer output scalar and its vision tower's standardisation vectors are checkpoint buffers, not
    # parameters (2,334 elements in 26B-A4B): left out of the comparison, as of the published counts
    buffers = tuple((n, tuple(t.shape)) for n, t in model.state_dict().items() if n not in param_names
                    and not n.endswith(_UNCOUNTED_BUFFERS))
    # a multimodal model's decoder: model.model.language_model, or Llama 4's model.language_model.model
    text = model.language_model.model if hasattr(model, "language_model") else getattr(
        model.model, "language_model", model.model)
    text_config = getattr(config, "text_config", config)
    windows, head_dims, moe_layers = [], [], []
    linear_layers = []
    for i, layer in enumerate(text.layers):
        block = getattr(layer, "block_type", None) if hasattr(layer, "mixer") else None  # Nemotron-H's block
        if block is not None:
            windows.append(None)
            if block == "linear_attention":
                linear_layers.append(i)
            elif block == "full_attention":
                head_dims.append(layer.mixer.head_dim)
            elif block == "moe":
                moe_layers.append(i)
            continue
        # Qwen3-Next / Qwen3.5's Gated DeltaNet, Granite 4.0's Mamba-2 (its layers hold mamba or self_attn, the other
        # None): no window, no heads of head_dim
        # (Kimi Linear's KDA sits in self_attn, its layer's block_type linear_attention)
        if hasattr(layer, "linear_attn") or getattr(layer, "mamba", None) is not None or getattr(
                layer, "block_type", None) == "linear_attention":
            linear_layers.append(i)
            windows.append(None)
        else:
            attn = layer.self_attn
            window = getattr(attn, "sliding_window", None)
            if model_type in _CONFIG_WIDE_WINDOW:
                window = config.sliding_window
            if getattr(attn, "is_sliding", True) is False:  # Exaone4Attention keeps the window on global layers too
                window = None
            if getattr(text_config, "layer_types", None) and text_config.layer_types[i] == "chunked_attention":
                window = text_config.attention_chunk_size  # Llama 4: the chunk its mask keeps
            windows.append(window or None)
            head_dims.append(getattr(attn, "qk_head_dim", getattr(attn, "head_dim", 0)))
        ffn = getattr(layer, "mlp", None) or getattr(layer, "feed_forward", None) or getattr(layer, "block_sparse_moe",
                                                                                            None)
        if hasattr(ffn, "experts") or hasattr(layer, "experts"):
            moe_layers.append(i)
    first_attention = next((layer for layer in text.layers if hasattr(layer, "self_attn")), None)
    return HFModel(
        class_name="Step3p7TextModel" if model_type == "step3p5" else type(model).__name__,
        params=tuple((_granite_name(n, bool(moe_layers)), tuple(p.shape)) for n, p in model.named_parameters()
                     if n in param_names),
        buffers=buffers,
        moe_layers=tuple(moe_layers),
        windows=tuple(windows),
        head_dims=tuple(head_dims),
        rotary_dim=2 * inv_freq.shape[0] if isinstance(inv_freq := getattr(
            getattr(text, "rotary_emb", None), "inv_freq", None), torch.Tensor) else None,
        qk_norm=first_attention is not None and any(hasattr(first_attention.self_attn, name)
                                                    for name in ("q_norm", "query_layernorm")),  # Hunyuan's name
        linear_layers=tuple(linear_layers),
        tied=not any(n.startswith(("lm_head", "language_model.lm_head")) for n, _ in model.named_parameters()),
        seconds=seconds,
    )


def _step3p7_fields(cfg: dict) -> dict:
    """aiconfigurator's flat Step-3.7 config in Step3p7TextConfig's names: num_experts as n_routed_experts, and
    first_k_dense_replace as moe_layers_enum (the MoE layers from it on), which the config class reads."""
    out = {_STEP3P7_KEYS.get(k, k): v for k, v in cfg.items()}
    if "first_k_dense_replace" in out and "moe_layers_enum" not in out:
        out["moe_layers_enum"] = ",".join(str(i) for i in range(out.pop("first_k_dense_replace"),
                                                                out["num_hidden_layers"]))
    return out


def _step3p7_text_model(config: object) -> torch.nn.Module:
    """Step3p7TextModel under ``model`` beside an untied lm_head [vocab, hidden], the parameter names of
    Step3p7ForConditionalGeneration's decoder without its vision tower."""
    from transformers.models.step3p7.modeling_step3p7 import Step3p7TextModel

    holder = torch.nn.Module()
    holder.model = Step3p7TextModel(config)
    holder.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
    return holder


def _granite_name(name: str, moe: bool) -> str:
    """Granite 4.0's FFN names as the other families': block_sparse_moe (router, experts) as mlp, its shared_mlp as
    the shared expert beside experts, else as the layer's dense MLP."""
    name = name.replace(".block_sparse_moe.", ".mlp.")
    return name.replace(".shared_mlp.", ".mlp.shared_expert." if moe else ".mlp.")


@functools.cache
def spec(name: str) -> ModelSpec:
    return load_hf_config(FIXTURE_DIR / f"{name}.json")


def _component(name: str) -> str:
    """The ``count_params`` component a transformers parameter or buffer name belongs to."""
    if (".vision_tower." in name or "multi_modal_projector." in name or ".mm_projector." in name
            or name.startswith(("model.visual.", "vision_model.", "model.embed_vision."))):
        return "encoder"
    if "embed_tokens" in name or name == "model.embeddings.weight":  # Nemotron-H's name for it
        return "embedding"
    if name.startswith(("lm_head", "language_model.lm_head")):
        return "lm_head"
    if re.search(r"\.(attn_hc|ffn_hc)\.|^model\.hc_head\.", name):  # DeepSeek-V4's hyper-connections
        return "norms"
    if "norm" in name.rsplit(".", 2)[-2]:  # *_layernorm, q_norm, k_norm, q_a_layernorm, kv_a_layernorm, model.norm
        return "norms"
    name = name.replace(".feed_forward.", ".mlp.").replace(".block_sparse_moe.", ".mlp.")  # Llama 4's, Granite's
    if ".shared_mlp." in name:  # Hunyuan's and Granite's shared expert
        return "shared_experts"
    if "_latent_proj." in name:  # Nemotron 3 Super's latent MoE: counted with the experts it feeds
        return "experts"
    if ".mixer." in name:  # Nemotron-H's block: an MoE's parts, an MLP's projections, else a Mamba-2 or attention mixer
        if re.search(r"\.mixer\.(experts|shared_experts|gate|up_proj|down_proj)\b", name):
            name = name.replace(".mixer.gate.", ".mlp.gate.").replace(".mixer.", ".mlp.")
        else:
            return "attention"
    name = re.sub(r"(\.layers\.\d+)\.(experts|router)\.", r"\1.mlp.\2.", name)  # Gemma 4's beside its dense MLP
    if ".mlp.experts." in name:
        return "experts"
    if ".mlp.shared_expert" in name:  # shared_expert(s).*, shared_expert_gate
        return "shared_experts"
    if ".mlp.gate." in name or ".mlp.router." in name or name.endswith(".mlp.e_score_correction_bias"):
        return "router"  # MiniMax-M2 keeps the score bias on the block, not the gate
    if ".mlp." in name:
        return "mlp"
    if ".self_attn." in name or ".linear_attn." in name or ".mamba." in name:  # Granite 4.0's Mamba-2 mixer
        return "attention"
    raise AssertionError(f"unclassified transformers parameter {name}")


def _score_bias_elements(s: ModelSpec) -> int:
    """Router score-correction biases, and DeepSeek-V4's hash-routing tables (vocab x top-k on each hash-routed layer,
    which has no score bias): counted by count_params, held as buffers by transformers."""
    if s.moe is None or not s.moe.router_score_correction_bias:
        return 0
    hashed = s.moe.hash_layers
    return s.moe.num_experts * (s.num_moe_layers - hashed) + s.vocab_size * s.moe.experts_per_token * hashed


def test_fixture_set_is_complete() -> None:
    assert set(PRESET_FIXTURES) <= set(FIXTURES)
    assert len(FIXTURES) >= len(PRESET_FIXTURES) + 7
    kinds = {_config(n)["model_type"] for n in (*FIXTURES, *WITHOUT_TRANSFORMERS)}
    read_as = kinds | {MULTIMODAL[kind].family for kind in kinds & set(MULTIMODAL)}  # a multimodal one's decoder
    read_as |= set(WITHOUT_TRANSFORMERS.values())
    assert read_as >= set(FAMILIES) and kinds >= set(MULTIMODAL), "every supported model_type has a fixture"


@pytest.mark.parametrize("name", FIXTURES)
def test_total_equals_transformers(name: str) -> None:
    hf, s = hf_model(name), spec(name)
    counts = count_params(s)
    held_as_buffers = _score_bias_elements(s)
    assert hf.buffer_numel == held_as_buffers, hf.buffers
    assert hf.param_numel == counts.total_params - held_as_buffers
    assert hf.param_numel + hf.buffer_numel == counts.total_params


@pytest.mark.parametrize("name", FIXTURES)
def test_components_equal_transformers(name: str) -> None:
    """Each component's matrix and vector (bias, norm, sink) elements match the named transformers tensors."""
    hf, counts = hf_model(name), count_params(spec(name))
    got = {c: [0, 0] for c in PARAM_COMPONENTS}
    for tensor_name, shape in (*hf.params, *hf.buffers):
        # gpt-oss stacks expert biases into 2-D tensors (experts x width): still biases, i.e. vector elements; a
        # Gated DeltaNet's depthwise conv taps (channels x 1 x kernel) are per-channel vectors, never quantized, and so
        # are Command R+'s per-head q and k norm weights (heads x head_dim) and KDA's A_log (1 x 1 x heads x 1)
        is_vector = len(shape) == 1 or tensor_name.endswith(("bias", "conv1d.weight", "q_norm.weight",
                                                              "k_norm.weight", "A_log"))
        got[_component(tensor_name)][1 if is_vector else 0] += _numel(shape)
    expected = {c: [p.matrix, p.vector] for c, p in counts.total.items()}
    assert got == expected


@pytest.mark.parametrize("name", FIXTURES)
def test_structure_equals_transformers(name: str) -> None:
    hf, s = hf_model(name), spec(name)
    # transformers' port of a remote-code checkpoint may spell its class apart (Kimi_K25ForConditionalGeneration)
    cfg = _config(name)
    assert hf.class_name.replace("_", "") == _REFERENCE_CLASS.get(cfg["model_type"],
                                                                  cfg["architectures"][0]).replace("_", "")
    assert len(hf.windows) == s.num_layers
    assert hf.moe_layers == tuple(i for i in range(s.num_layers) if s.is_moe_layer(i))
    assert hf.windows == tuple(s.sliding_window if s.is_sliding_layer(i) else None for i in range(s.num_layers))
    attention_layers = [i for i in range(s.num_layers) if not s.is_linear_layer(i) and s.has_mixer(i)]
    assert hf.head_dims == tuple(s.layer_kind_spec(s.is_sliding_layer(i)).head_dim for i in attention_layers)
    assert hf.qk_norm == s.qk_norm
    assert hf.linear_layers == tuple(i for i in range(s.num_layers) if s.is_linear_layer(i))
    assert hf.rotary_dim in (None, s.rotary_dim)
    assert hf.tied == s.tie_word_embeddings


@pytest.mark.parametrize("name", PRESET_FIXTURES)
def test_preset_agrees_with_config_and_transformers(name: str) -> None:
    preset, from_config, hf = load_model(name), spec(name), hf_model(name)
    assert count_params(preset).total_params == hf.param_numel + hf.buffer_numel
    assert count_params(preset).total_params == count_params(from_config).total_params

    def kv_fields(s: ModelSpec) -> dict[str, object]:
        fields = {"num_layers": s.num_layers, "num_kv_heads": s.num_kv_heads, "sliding_window": s.sliding_window,
                  "sliding_window_layers": s.sliding_window_layers, "mla": s.mla}
        if s.mla is None:
            fields["head_dim"] = s.head_dim
        return fields

    assert kv_fields(preset) == kv_fields(from_config)


def _differing_fields(preset: ModelSpec, from_config: ModelSpec) -> dict[str, tuple[object, object]]:
    """Every ModelSpec field where the two differ, but the name, a quantized checkpoint's exceptions (its
    modules_to_not_convert) and hf_repo (the checkpoint to serve: the preset's sourced choice), which are no shapes."""
    skip = {"name", "quantized_weight_exceptions", "hf_repo"}
    return {f.name: (getattr(preset, f.name), getattr(from_config, f.name)) for f in dataclasses.fields(ModelSpec)
            if f.name not in skip and getattr(preset, f.name) != getattr(from_config, f.name)}


@pytest.mark.parametrize("name", PRESET_FIXTURES)
def test_preset_equals_config_spec_in_every_field(name: str) -> None:
    """Beyond counts and KV fields: the preset and its config.json agree on biases, MoE, rope, dtype, context..."""
    differing = _differing_fields(load_model(name), spec(name))
    assert not differing, f"preset vs config.json: {differing}"


@pytest.mark.parametrize("name", sorted(PRESETS_WITHOUT_TRANSFORMERS))
def test_preset_without_transformers_equals_its_config_in_every_field(name: str) -> None:
    """Llama-3.3-Nemotron-Super-49B: the preset's per-layer MLP widths and attention-free layers are what the
    family reader derives from block_configs (its count is checked against a brute-force one in
    tests/spec/test_hf_config_nas.py); its repository id names it."""
    preset, from_config = load_model(name), spec(PRESETS_WITHOUT_TRANSFORMERS[name])
    differing = _differing_fields(preset, from_config)
    assert not differing, f"preset vs config.json: {differing}"
    assert count_params(preset).total == count_params(from_config).total
    assert preset.hf_repo is not None and load_model(preset.hf_repo).name == name


@pytest.mark.parametrize("name", sorted(ALIAS_FIXTURES))
def test_an_alias_checkpoint_is_its_preset_in_every_field(name: str) -> None:
    """DeepSeek-R1, GLM-5.1 and GLM-5.3 ship DeepSeek-V3's, GLM-5's and GLM-5.2's config.json, Meta-Llama-3.1-70B the
    llama3-70b preset's: named by their repository ids, the presets serve those checkpoints and agree with their
    configs in every field (and with transformers, as every fixture)."""
    preset_name, repo = ALIAS_FIXTURES[name]
    preset = load_model(repo)
    assert (preset.name, preset.hf_repo) == (preset_name, repo)
    assert not _differing_fields(preset, spec(name)), f"preset vs config.json: {_differing_fields(preset, spec(name))}"

def _transformers_default(cls: type, key: str) -> object:
    for f in dataclasses.fields(cls):
        if f.name == key:
            if f.default is not dataclasses.MISSING:
                return f.default
            return f.default_factory()  # type: ignore[misc]
    raise KeyError(key)


# Defaults in FAMILIES that are not config-class fields, and why.
_NOT_CLASS_FIELDS = {
    "head_dim": "no field: the attention uses getattr(config, 'head_dim', hidden // heads); DERIVED (None)",
    "moe_layer_freq": "not read by transformers; DeepSeek's own modeling code's default 1",
    "first_k_dense_replace": "Glm4MoeLiteConfig: its mlp_layer_types defaults to one dense layer first; "
                             "Step3p7TextConfig: to three (MoE from layer 3 on); KimiLinearConfig reads "
                             "kwargs.get('first_k_dense_replace', 1)",
    "sliding_window_pattern": "Gemma3TextConfig reads kwargs.get('sliding_window_pattern', 6)",
    "rope_local_base_freq": "Gemma3TextConfig.default_theta['local']",
    "full_attention_interval": "Qwen3-Next / Qwen3.5: __post_init__ reads kwargs.pop('full_attention_interval', 4)",
    "global_head_dim": "Gemma4TextConfig.__post_init__ reads kwargs.pop('global_head_dim', 512)",
}


def test_multimodal_defaults_match_transformers_config_classes() -> None:
    """The text defaults a nested text_config falls back on, and SigLIP's vision defaults, are transformers'."""
    from transformers import PixtralVisionConfig, Qwen2_5_VLVisionConfig, SiglipVisionConfig

    def value(config: object, key: str) -> object:  # transformers 5 keeps rope_theta in rope_parameters
        return config.rope_parameters["rope_theta"] if key == "rope_theta" else getattr(config, key)

    for model_type, m in MULTIMODAL.items():
        text = CONFIG_MAPPING[m.text_type]()
        assert {key: value(text, key) for key in m.text_defaults} == dict(m.text_defaults), model_type
    for cls, defaults in ((SiglipVisionConfig, SIGLIP_DEFAULTS), (PixtralVisionConfig, PIXTRAL_DEFAULTS),
                          (CONFIG_MAPPING["llama4_vision_model"], LLAMA4_VISION_DEFAULTS)):
        assert {key: getattr(cls(), key) for key in defaults} == defaults
    renamed = {"num_hidden_layers": "depth", "num_channels": "in_channels"}  # tfcalc's names for Qwen's keys
    for qwen, defaults in ((Qwen2_5_VLVisionConfig(), QWEN2_5_VL_DEFAULTS),
                           (CONFIG_MAPPING["qwen3_5_vision"](), QWEN3_5_VISION_DEFAULTS),
                           (CONFIG_MAPPING["qwen3_5_moe_vision"](), QWEN3_5_VISION_DEFAULTS),
                           (CONFIG_MAPPING["qwen3_vl_vision"](), QWEN3_VL_VISION_DEFAULTS),
                           (CONFIG_MAPPING["qwen3_vl_moe_vision"](), QWEN3_VL_VISION_DEFAULTS)):
        got = {key: getattr(qwen, renamed.get(key, key)) for key in defaults}
        assert {key: list(v) if isinstance(v, tuple) else v for key, v in got.items()} == defaults
    kimi = CONFIG_MAPPING["kimi_k25_vision"]()  # its pos_emb_* are the checkpoints' init_pos_emb_*; 3 channels fixed
    renamed = {"init_pos_emb_height": "pos_emb_height", "init_pos_emb_width": "pos_emb_width"}
    got = {key: getattr(kimi, renamed.get(key, key)) for key in KIMI_K25_VISION_DEFAULTS if key != "num_channels"}
    assert {key: list(v) if isinstance(v, tuple) else v for key, v in got.items()} == {
        key: v for key, v in KIMI_K25_VISION_DEFAULTS.items() if key != "num_channels"}
    mistral3 = CONFIG_MAPPING["mistral3"](text_config={"model_type": "mistral"})
    assert (mistral3.spatial_merge_size, mistral3.multimodal_projector_bias) == (2, False)


@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) - set(WITHOUT_TRANSFORMERS.values())))
def test_family_defaults_match_transformers_config_classes(model_type: str) -> None:
    cls = CONFIG_MAPPING[_REFERENCE_TYPE.get(model_type, model_type)]
    field_names = {f.name for f in dataclasses.fields(cls)}
    for key, value in FAMILIES[model_type].defaults.items():
        rope = getattr(cls(), "rope_parameters", None) or {}  # Nemotron-H has none: its attention turns nothing
        per_type = rope if isinstance(rope.get("full_attention"), dict) else None
        if key in ("rope_theta", "rope_local_base_freq") and per_type is not None:  # Gemma 4: one per layer type
            layer_type = "full_attention" if key == "rope_theta" else "sliding_attention"
            assert value == per_type[layer_type]["rope_theta"]
        elif key == "rope_theta":
            theta = cls.default_theta
            assert value == (theta["global"] if isinstance(theta, dict) else theta)
        elif key == "rope_local_base_freq":
            assert value == cls.default_theta["local"]
        elif key == "sliding_window_pattern":
            assert value == 6
        elif key == "full_attention_interval":
            assert cls().layer_types == ["full_attention" if (i + 1) % value == 0 else "linear_attention"
                                         for i in range(cls().num_hidden_layers)]
        elif key == "partial_rotary_factor":  # set in __post_init__ (Glm4MoeConfig: 0.5 "for BC")
            assert cls().rope_parameters.get("partial_rotary_factor", 1.0) == value
        elif key in field_names:
            assert _transformers_default(cls, key) == value, key
        else:
            assert key in _NOT_CLASS_FIELDS, f"{model_type}: default for {key} has no transformers counterpart"
            if key == "head_dim":
                assert value is None


def test_meta_models_build_quickly() -> None:
    """Every fixture builds on the meta device in well under the 20 s budget (the largest take about 1 s)."""
    slow = {n: round(hf_model(n).seconds, 1) for n in FIXTURES if hf_model(n).seconds > 20}
    assert not slow


# Shapes no released checkpoint has, where tfcalc/calc/params.py once disagreed with transformers.
_MLA_EDGE_CASES = {
    # DeepseekV2/V3Attention: without q_lora_rank, q_proj is nn.Linear(..., bias=False) whatever attention_bias
    # says (params.attention_params once added heads * qk_head_dim of bias here).
    "mla-no-q-lora-with-attention-bias": {"attention_bias": True},
    # DeepseekV2Moe.shared_experts is a DeepseekV2MLP, so mlp_bias gives it gate/up/down biases.
    "deepseek-v2-mlp-bias": {"mlp_bias": True},
}


@pytest.mark.parametrize("case", sorted(_MLA_EDGE_CASES))
def test_mla_edge_cases(case: str) -> None:
    cfg = {**_config("deepseek-v2-lite"), "num_hidden_layers": 3, **_MLA_EDGE_CASES[case]}
    s = spec_from_hf_config(cfg, origin=case, name=case)
    model_type = cfg.pop("model_type")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg))
    assert sum(p.numel() for p in model.parameters()) == count_params(s).total_params


def test_qwen3_next_layer_equals_its_published_printout() -> None:
    """A public reading note prints Qwen/Qwen3-Next-80B-A3B-Instruct cut to one layer (torchinfo: its Gated DeltaNet
    + MoE decoder layer holds 1,648,531,648 parameters, the embedding 1519 x 2048): tfcalc's count of layer 0."""
    from tfcalc.calc.params import linear_attention_shape, linear_norms_shape, router_params, shared_experts_shape

    s = load_model("qwen3-next-80b-a3b")
    assert s.moe is not None and s.is_linear_layer(0) and s.is_moe_layer(0)
    expert = 3 * 2048 * 512
    layer = (linear_attention_shape(s).total().total + linear_norms_shape(s).total().total
             + s.moe.num_experts * expert + shared_experts_shape(s).total().total + router_params(s).total)
    assert layer == 1_648_531_648
    one_layer = s.with_overrides(layers=1, vocab_size=1519)
    assert count_params(one_layer).total_params == 1_654_755_520  # the printout's total
