"""Llama-3.3-Nemotron-Super-49B-v1 (model_type nemotron-nas, DeciLMForCausalLM): transformers has no class for it, so
its counts are checked against a brute-force count of its block_configs written here from vLLM's nemotron_nas.py
(DeciLMDecoderLayer), and against the model card's published total."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from hf_fixtures import FIXTURE_DIR, build, fixture
from typer.testing import CliRunner

from tfcalc.calc.kv_cache import kv_bytes_per_token
from tfcalc.calc.params import count_params
from tfcalc.calc.shard import Parallelism, shard, stage_layers, stage_weight_bytes
from tfcalc.cli import app
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import SpecError
from tfcalc.model.transformer import TransformerBlock

NAME = "llama-3.3-nemotron-super-49b-v1"
BF16 = get_dtype("bf16")


def _width(ffn: dict[str, Any], hidden: int) -> int:
    """vLLM nemotron_nas.py _ffn_mult_to_intermediate_size: int(2 x ffn_mult x h / 3), then the next multiple of
    256 (_find_multiple)."""
    n = int(2 * ffn["ffn_mult"] * hidden / 3)
    return n if n % 256 == 0 else n + 256 - n % 256


def _brute_force(cfg: dict[str, Any], tp: int = 1) -> tuple[int, list[int]]:
    """(every parameter, each layer's parameters on one of ``tp`` GPUs) tensor by tensor: q [h, H d], k and v
    [h, kv d], o [H d, h], input_layernorm [h] on an attention layer (KV heads = H / n_heads_in_group);
    gate, up [h, I], down [I, h] and post_attention_layernorm [h] on every layer; embedding, lm_head, final norm."""
    h, heads, vocab = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    d = h // heads
    per_layer = []
    for block in cfg["block_configs"]:
        attention, ffn = block["attention"], block["ffn"]
        n = 0
        if not attention["no_op"]:
            kv = heads // attention["n_heads_in_group"]
            n += (h * heads * d + 2 * h * kv * d + heads * d * h) // tp + h
        n += 3 * h * _width(ffn, h) // tp + h
        per_layer.append(n)
    return 2 * vocab * h + h + sum(per_layer), per_layer


def test_total_equals_brute_force_and_the_published_count() -> None:
    """Published: 49.87B (huggingface.co/nvidia/Llama-3_3-Nemotron-Super-49B-v1, the Hub's parameter count as the
    task brief quotes it; the card's own text says 49B, derived from Llama-3.3-70B)."""
    counts = count_params(build(NAME))
    total, _ = _brute_force(fixture(NAME))
    assert counts.total_params == total
    assert round(counts.total_params / 1e9, 2) == 49.87


def test_preset_holds_the_brute_force_blocks() -> None:
    """The bundled preset's per-layer MLP widths and attention-free layers, computed here from block_configs as vLLM
    does, and its total, the brute-force count."""
    from tfcalc.spec.presets import load_model

    cfg, preset = fixture(NAME), load_model("llama-3.3-nemotron-super-49b")
    blocks = cfg["block_configs"]
    assert preset.layer_intermediate_sizes == tuple(_width(b["ffn"], cfg["hidden_size"]) for b in blocks)
    assert preset.mixer_free_layers == tuple(i for i, b in enumerate(blocks) if b["attention"]["no_op"])
    assert count_params(preset).total_params == _brute_force(cfg)[0]


def test_block_configs_read_layer_by_layer() -> None:
    cfg, spec = fixture(NAME), build(NAME)
    blocks = cfg["block_configs"]
    assert spec.remote_code and spec.architecture == "DeciLMForCausalLM"
    assert spec.mixer_free_layers == tuple(i for i, b in enumerate(blocks) if b["attention"]["no_op"])
    assert spec.num_attention_layers == 49 and spec.num_kv_heads == 8 and spec.ffn_free_layers == ()
    assert [spec.ffn_width(i) for i in range(80)] == [_width(b["ffn"], 8192) for b in blocks]
    assert spec.intermediate_size == 28672  # ffn_mult 5.25: int(2 x 5.25 x 8192 / 3) = 28672, a multiple of 256
    assert spec.ffn_width(11) == 17920      # ffn_mult 3.28125: 17920


def test_kv_bytes_per_token_by_hand() -> None:
    """Only the attention layers cache (vLLM DeciModel counts kv_cache_index over them): 49 layers x 8 KV heads x
    128 x 2 (K, V) x 2 B = 200,704 B a token in bf16, against Llama 3.3 70B's 80 layers' 327,680."""
    cfg = fixture(NAME)
    attention = [b for b in cfg["block_configs"] if not b["attention"]["no_op"]]
    by_hand = sum(64 // b["attention"]["n_heads_in_group"] * 128 * 2 * 2 for b in attention)
    assert kv_bytes_per_token(build(NAME), BF16) == by_hand == 200_704


@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 3)])
def test_weights_per_gpu_equal_the_brute_force_split(tp: int, pp: int) -> None:
    """Each stage's bf16 weights: its layers' brute-force split over tp x 2 bytes, the embedding (first stage) and
    the final norm and lm_head (last) split by vocabulary rows."""
    cfg, spec = fixture(NAME), build(NAME)
    _, per_layer = _brute_force(cfg, tp)
    precision = parse_weight_precision("bf16")
    sh = shard(spec, Parallelism(tp=tp, pp=pp))
    table = math.ceil(cfg["vocab_size"] / tp) * cfg["hidden_size"]
    ranges = stage_layers(80, pp)
    for s, layers in enumerate(ranges):
        first, last = s == 0, s == len(ranges) - 1
        expected = sum(per_layer[i] for i in layers) + (table if first else 0) + (
            table + cfg["hidden_size"] if last else 0)
        assert stage_weight_bytes(spec, sh, precision, layers, first, last) == 2 * expected


def test_bundled_blocks_hold_the_brute_force_shapes() -> None:
    """The bundled decoder's blocks, built on the meta device at h 256 (16 heads, ffn_mult kept), hold each
    layer's brute-force parameters: no attention or its norm on a no-op layer, the MLP of the layer's own width."""
    import torch

    small = {"hidden_size": 256, "num_attention_heads": 16, "vocab_size": 512}
    cfg = fixture(NAME, **small)
    spec = build(NAME, **small)
    _, per_layer = _brute_force(cfg)
    with torch.device("meta"):
        for i in (0, 6, 11, 40, 79):
            block = TransformerBlock(spec, i)
            assert sum(p.numel() for p in block.parameters()) == per_layer[i], i
            assert (block.attention is None) == cfg["block_configs"][i]["attention"]["no_op"]


def test_work_reads_each_layer_width() -> None:
    """Decode reads every weight once: the per-token weight bytes of the layers add up to the stage's weights."""
    from tfcalc.calc.work import Model, _linear

    spec = build(NAME)
    precision = parse_weight_precision("bf16")
    sh = shard(spec, Parallelism())
    _, read = _linear(Model(spec=spec, sh=sh, precision=precision, kv_dtype=BF16), 1.0)
    total = count_params(spec).total_params - 2 * spec.vocab_size * spec.hidden_size
    assert read == Fraction(2 * total)


@pytest.mark.parametrize("changes, message", [
    ({"block_configs": []}, "field 'block_configs' must give an attention and an ffn entry for each of the 80"),
    ({"block_configs": "x"}, "field 'block_configs' must give"),
])
def test_malformed_block_configs_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        build(NAME, **changes)
    assert "\n" not in str(info.value)


def _with_block(i: int, part: str, **entry: Any) -> list[dict[str, Any]]:
    blocks = [dict(b) for b in fixture(NAME)["block_configs"]]
    blocks[i] = {**blocks[i], part: {**blocks[i][part], **entry}}
    return blocks


@pytest.mark.parametrize("i, part, entry, message", [
    (3, "attention", {"replace_with_linear": True}, r"block_configs\[3\].attention.replace_with_linear is not "
                                                    "supported"),
    (3, "ffn", {"replace_with_linear": True}, r"block_configs\[3\].ffn.replace_with_linear is not supported"),
    (3, "ffn", {"no_op": True}, r"block_configs\[3\].ffn.no_op is not supported"),
    (3, "attention", {"n_heads_in_group": 4}, "attention layers of 8, 16 KV heads; tfcalc models one KV head count"),
    (3, "attention", {"n_heads_in_group": 7}, r"n_heads_in_group \(7\) does not divide num_attention_heads"),
    (3, "attention", {"n_heads_in_group": None}, "n_heads_in_group' must be an integer"),
    (3, "ffn", {"ffn_mult": "x"}, "ffn_mult' must be a number"),
    (3, "ffn", {"ffn_mult": 1e5}, "intermediate_size"),
])
def test_unsupported_blocks_are_refused_in_one_line(i: int, part: str, entry: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        build(NAME, block_configs=_with_block(i, part, **entry))
    assert "\n" not in str(info.value) and str(info.value).startswith(f"{NAME}.json")


@pytest.mark.parametrize("command", [
    ["params"], ["kv-cache", "--context", "128k"], ["plan", "--gpu", "h100-sxm", "--num-gpus", "2"],
    ["estimate", "--gpu", "h100-sxm", "--tp", "2"],
])
def test_commands_run_without_a_traceback(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--config", str(FIXTURE_DIR / f"{NAME}.json")])
    assert result.exit_code == 0, result.output
    assert result.exception is None and "Traceback" not in result.output


def test_latency_streams_each_layer_width() -> None:
    """A decode step of one token streams every weight once: the latency model's weight bytes are the model's bf16
    bytes (2 per parameter, the embedding's gathered row aside), which the per-layer MLP widths make 49.87B, not
    the 80 x 28,672-wide MLPs of a uniform reading."""
    from tfcalc.calc.latency import StepShape, deployment, step_time
    from tfcalc.spec.presets import load_gpu

    spec = build(NAME)
    d = deployment(spec, load_gpu("h100-sxm"), parse_weight_precision("bf16"), BF16)
    streamed = step_time(d, StepShape(decode_seqs=1, decode_context=1)).weight_bytes
    without_table = 2 * (count_params(spec).total_params - spec.vocab_size * spec.hidden_size)
    assert abs(streamed - without_table) / without_table < 1e-3
