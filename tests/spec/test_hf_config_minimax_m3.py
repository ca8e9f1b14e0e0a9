"""MiniMax-M3 (minimax_m3, and NVIDIA's NVFP4 copy as minimax_m3_vl) read from config.json: against the model card,
its KV cache against a hand count from the config, the NVFP4 copy's weight bytes against a count over the modules
its quantization_config names, its refusals, and the CLI commands on both fixtures."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import pytest
import torch  # noqa: TID251 - test-only comparison with transformers
import transformers
from hf_fixtures import FIXTURE_DIR, build, fixture
from typer.testing import CliRunner

from tfcalc.calc.kv_cache import kv_bytes_per_token
from tfcalc.calc.memory import weights_bytes
from tfcalc.calc.params import count_params
from tfcalc.cli import app
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import SpecError

TEXT, NVFP4 = "minimax-m3", "minimax-m3-nvfp4"


@pytest.mark.parametrize("name", [TEXT, NVFP4])
def test_total_and_active_against_the_card(name: str) -> None:
    """MiniMaxAI/MiniMax-M3 card (Model Details): "Total Parameters ~428B", "Activated Parameters ~23B"; the card's
    active figure leaves out the embedding table and the output head (25.96 B with them, 23.50 B without)."""
    counts = count_params(build(name))
    assert counts.total_params == pytest.approx(428e9, rel=0.01)
    head = counts.total["embedding"].total + counts.total["lm_head"].total
    assert counts.active_params - head == pytest.approx(23e9, rel=0.03)


def test_kv_bytes_per_token_equal_a_hand_count_from_the_config() -> None:
    """K and V of num_key_value_heads x head_dim on every layer, plus one index key of sparse_index_dim on each layer
    sparse_attention_freq marks, all in bf16 (transformers MiniMaxM3VLSparseCacheLayer's idx_keys)."""
    cfg = fixture(TEXT)
    msa = cfg["sparse_attention_config"]
    by_hand = (cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
               + sum(msa["sparse_attention_freq"]) * msa["sparse_index_dim"] * 2)
    assert kv_bytes_per_token(build(TEXT), get_dtype("bf16")) == by_hand == 137_472
    assert kv_bytes_per_token(build(NVFP4), get_dtype("bf16")) == by_hand


def test_layout_and_sparse_attention_follow_the_config() -> None:
    spec, cfg = build(TEXT), fixture(TEXT)
    msa = cfg["sparse_attention_config"]
    si = spec.sparse_indexer
    assert spec.moe is not None and si is not None
    assert spec.moe.dense_layers == tuple(i for i, f in enumerate(cfg["moe_layer_freq"]) if not f) == (0, 1, 2)
    assert si.layers == tuple(i for i, f in enumerate(msa["sparse_attention_freq"]) if f)
    assert (si.kind, si.num_heads, si.head_dim, si.topk, si.block_size) == (
        "minimax_m3", msa["sparse_num_index_heads"], msa["sparse_index_dim"], msa["sparse_topk_blocks"],
        msa["sparse_block_size"])
    assert si.topk * si.block_size == 16 * 128   # the most keys a sparse layer's query attends
    assert 0 not in si.layers and 3 in si.layers  # layer 0 attends every key, layer 3 the selected blocks
    assert spec.rotary_dim == cfg["rotary_dim"] and spec.intermediate_size == cfg["dense_intermediate_size"]
    assert spec.num_mtp_layers == cfg["num_nextn_predict_layers"]  # not num_mtp_modules (7 here, 1 in NVIDIA's)


_BITS = {"NVFP4": Fraction(9, 2), "MXFP8": Fraction(33, 4)}  # 4 + 8/16 (E4M3 per 16); 8 + 8/32 (E8M0 per 32)


def test_nvfp4_copy_weight_bytes_equal_a_count_over_the_named_modules() -> None:
    """Every module the checkpoint's quantized_layers names, sized from the text config (experts' w1/w3 h x I, w2
    I x h, ...), at its algorithm's width; every other tensor of transformers' meta-device model (embedding, head,
    norms, routers, the vision tower) at 16 bits."""
    data = fixture(NVFP4)
    text = data["text_config"]
    h, nh, kv, d = text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]
    msa = text["sparse_attention_config"]
    ih, idim = msa["sparse_num_index_heads"], msa["sparse_index_dim"]
    size = {"q_proj": h * nh * d, "k_proj": h * kv * d, "v_proj": h * kv * d, "o_proj": nh * d * h,
            "index_q_proj": h * ih * idim, "index_k_proj": h * idim,
            "mlp": h * text["dense_intermediate_size"], "shared_experts": h * text["shared_intermediate_size"],
            "experts": h * text["intermediate_size"]}
    quantized_elements, quantized_bytes = 0, Fraction(0)
    for module, entry in data["quantization_config"]["quantized_layers"].items():
        kind = re.search(r"\.(self_attn\.(\w+)|mlp|shared_experts|experts)\.", module + ".")
        assert kind is not None, module
        n = size[kind.group(2) or kind.group(1)]
        quantized_elements += n
        quantized_bytes += n * _BITS[entry["quant_algo"]] / 8
    data.pop("quantization_config")
    kind = data.pop("model_type")
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(transformers.AutoConfig.for_model(kind, **data))
    every = sum(t.numel() for t in model.state_dict().values())
    by_modules = quantized_bytes + (every - quantized_elements) * 2
    spec = build(NVFP4)
    assert spec.native_dtype == "attention=mxfp8,mlp=mxfp8,experts=nvfp4,shared_experts=mxfp8,default=bf16"
    assert weights_bytes(count_params(spec), parse_weight_precision(spec.native_dtype)) == by_modules


@pytest.mark.parametrize("changes, message", [
    ({"n_shared_experts": 2}, "n_shared_experts"),
    ({"qk_norm_type": "per_layer"}, "per-head QK-norm"),
    ({"attention_output_gate": True}, "attention_output_gate"),
    ({"moe_layer_freq": [1, 0]}, "moe_layer_freq"),
])
def test_unsupported_fields_are_one_line(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        build(TEXT, **changes)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("msa, message", [
    ({"sparse_init_block": 1}, "sparse_init_block"),
    ({"sparse_score_type": "mean"}, "sparse_score_type"),
    ({"use_sparse_attention": False}, "use_sparse_attention"),
    ({"sparse_disable_index_value": [0] * 60}, "index-value"),
    ({"sparse_attention_freq": [1] * 59}, "layer_types"),
])
def test_unsupported_sparse_attention_is_one_line(msa: dict[str, Any], message: str) -> None:
    config = fixture(TEXT)
    with pytest.raises(SpecError, match=message) as info:
        build(TEXT, sparse_attention_config={**config["sparse_attention_config"], **msa})
    assert "\n" not in str(info.value)


def test_bundled_decoder_refuses_msa_in_one_line() -> None:
    from tfcalc.model.transformer import build_model

    with pytest.raises(SpecError, match="MiniMax-M3's block-sparse attention"):
        build_model(build(TEXT), device="meta")


@pytest.mark.parametrize("name", [TEXT, NVFP4])
@pytest.mark.parametrize("command", [["params"], ["kv-cache", "--context", "131072"],
                                     ["plan", "--gpu", "h200", "--tp", "8", "--context", "131072"],
                                     ["estimate", "--gpu", "h200", "--tp", "8"]])
def test_cli_commands_run(name: str, command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--config", str(FIXTURE_DIR / f"{name}.json")])
    assert result.exit_code == 0 and result.exception is None, result.output
    assert name in result.output
