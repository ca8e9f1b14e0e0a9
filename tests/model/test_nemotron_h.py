"""Nemotron-H (Nemotron 3 Nano-like: Mamba-2, MoE and attention blocks; Nemotron-H-like: Mamba-2, MLP and attention
blocks): the chunked SSD scan equals the recurrence, cached decode and chunked prefill equal one prefill, the blocks
hold one mixer or one FFN, the fixed states replace the KV cache on Mamba-2 layers, the parameters are the
calculator's, and transformers' NemotronHForCausalLM with our weights gives our logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from small_configs import SMALL_NEMOTRON_H, SMALL_NEMOTRON_NANO, SMALL_NEMOTRON_SUPER, small_config_spec
from test_transformer import compiled_decode_error, logit_differences, run_in_chunks, twin_models

from tfcalc.calc.kv_cache import kv_cache_bytes
from tfcalc.calc.params import count_params
from tfcalc.dtypes import get_dtype
from tfcalc.model import Transformer, build_model
from tfcalc.model.layers import Attention, FeedForward, MoE
from tfcalc.model.mamba import GroupedGatedRMSNorm, Mamba2Mixer, segment_sum, ssd_chunked, ssd_step
from tfcalc.model.scaling import describe_layers, keep_layers, layer_kind, pick_layers
from tfcalc.spec.hf_config import load_hf_config, spec_from_hf_config

CONFIGS = {"nano": SMALL_NEMOTRON_NANO, "nemotron_h": SMALL_NEMOTRON_H, "super": SMALL_NEMOTRON_SUPER,
           "biases": {**SMALL_NEMOTRON_H, "mamba_proj_bias": True, "use_bias": True}}
FIXTURES = Path(__file__).parents[1] / "fixtures/hf_configs"
# 21 tokens: more than two of the 8-token chunks (the last one padded); decode from 10, and prefill chunks shorter
# than the conv's 3 rows, across chunk boundaries
TOTAL = 21
RUNS = {"prefill": [TOTAL], "decode": [10] + [1] * (TOTAL - 10), "chunks": [9, 2, 7, 1, 2]}


def _random_scan_inputs(b: int, h: int, t: int, p: int, n: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    dt = torch.rand(b, h, t, generator=generator, dtype=torch.float64) + 0.05
    a = -torch.rand(h, generator=generator, dtype=torch.float64) * 3 - 0.1  # decays exp(dt A) in (e^-3.2, 1)
    return draw(b, h, t, p), dt, a, draw(b, h, t, n), draw(b, h, t, n), draw(b, h, p, n)


def test_segment_sum_sums_each_span() -> None:
    """Entry (i, j) is a_{j+1} + ... + a_i below the diagonal, 0 on it, -inf above."""
    a = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    s = segment_sum(a)
    assert s[3, 0] == 14 and s[3, 1] == 12 and s[2, 1] == 4 and s[1, 1] == 0 and s[0, 3] == float("-inf")


@pytest.mark.parametrize("chunk", [8, 5, 1, 64])
def test_chunked_scan_equals_the_recurrence(chunk: int) -> None:
    """21 tokens from a non-zero state in chunks of 8 and 5 (the last padded), 1, or one chunk: the outputs and final
    state of the SSD chunked form equal the token-by-token recurrence in float64."""
    x, dt, a, b, c, state = _random_scan_inputs(2, 3, 21, 5, 4, torch.Generator().manual_seed(0))
    outputs, s = [], state
    for i in range(21):
        y, s = ssd_step(x[:, :, i], dt[..., i], a, b[:, :, i], c[:, :, i], s)
        outputs.append(y)
    out, final = ssd_chunked(x, dt, a, b, c, state, chunk)
    torch.testing.assert_close(out, torch.stack(outputs, dim=2), atol=1e-12, rtol=0)
    torch.testing.assert_close(final, s, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["nano", "nemotron_h"])
def test_cached_decode_and_chunked_prefill_equal_one_prefill(name: str) -> None:
    """Prefill chunks (conv and SSM states carried across them, chunks shorter than the conv's 3 rows included) and
    decode steps give the logits of one prefill (float64); reset() starts a new sequence; a batch smaller than the
    states' is served by their first rows."""
    torch.manual_seed(0)
    spec = small_config_spec(CONFIGS[name])
    model = build_model(spec, dtype=torch.float64)
    model.setup_caches(batch=3, max_len=24)
    tokens = torch.randint(0, spec.vocab_size, (2, TOTAL))
    full = run_in_chunks(model, tokens, [TOTAL])
    for chunks in RUNS.values():
        torch.testing.assert_close(run_in_chunks(model, tokens, chunks), full, atol=1e-10, rtol=0)
    torch.testing.assert_close(run_in_chunks(model, tokens, [1, 1, 19]), full, atol=1e-10, rtol=0)
    assert run_in_chunks(model, tokens[:1], [TOTAL]).sub(full[:1]).abs().max() < 1e-10


def test_compiled_decode_step_captures_mamba_layers_as_one_graph() -> None:
    """The Mamba-2 step writes its conv and SSM states in place (module buffers), so a decode step of the dense
    Nemotron-H traces with torch.compile(fullgraph=True) (aot_eager) and gives the logits of one prefill."""
    assert compiled_decode_error(small_config_spec(SMALL_NEMOTRON_H)) < 1e-4


def test_blocks_hold_one_mixer_or_one_ffn() -> None:
    """Each block holds what its letter says (M: Mamba-2, *: attention without RoPE, E: MoE, -: relu^2 MLP) behind one
    norm; the scaled-down layer kinds tell the four apart."""
    for config in (SMALL_NEMOTRON_NANO, SMALL_NEMOTRON_H):
        spec = small_config_spec(config)
        model = build_model(spec, device="meta")
        kinds = {Mamba2Mixer: "M", Attention: "*", MoE: "E", FeedForward: "-"}
        held = "".join(kinds[type(block.attention if block.attention is not None else block.ffn)]
                       for block in model.layers)
        assert held == config["hybrid_override_pattern"]
        for block in model.layers:
            assert (block.attention is None) != (block.ffn is None)
            assert (block.attention_norm is None) == (block.attention is None)
            assert (block.ffn_norm is None) == (block.ffn is None)
            assert not isinstance(block.attention, Attention) or not block.attention.rotary
        names = {"M": "mamba", "*": "attention nope", "E": "moe", "-": "mlp"}
        assert [layer_kind(spec, i) for i in range(spec.num_layers)] == [
            names[letter] for letter in config["hybrid_override_pattern"]]


def test_mamba_layers_hold_a_fixed_state_and_no_kv_cache() -> None:
    """Only the attention block gets a KV cache; each Mamba-2 layer holds conv_dim x (K - 1) conv elements in the
    model dtype and heads x head_dim x d_state SSM ones in float32 (mamba_ssm_cache_dtype), whatever the length: the
    calculator's `kv-cache` bytes (which count the states) for a bf16 model."""
    spec = small_config_spec(SMALL_NEMOTRON_NANO)
    la = spec.linear_attention
    assert la is not None and la.conv_dim == 60 + 2 * 2 * 8
    for length in (8, 64):
        model = build_model(spec, dtype=torch.bfloat16, device="meta")
        model.setup_caches(batch=3, max_len=length)
        assert model.kv_cache_bytes() == spec.num_attention_layers * 3 * length * 2 * spec.num_kv_heads * 16 * 2
        per_sequence = 2 * la.conv_state_elements + 4 * la.recurrent_state_elements
        assert model.state_bytes() == spec.num_linear_layers * 3 * per_sequence
        assert model.kv_cache_bytes() + model.state_bytes() == kv_cache_bytes(spec, get_dtype("bf16"), length, 3)


@pytest.mark.parametrize("fixture", ["nemotron-3-nano-30b-a3b", "nemotron-h-56b", "nemotron-3-super-120b-a12b"])
def test_released_configs_scaled_down_count_as_the_calculator(fixture: str) -> None:
    """The released configs at 6 layers with their real widths (meta device): the layer pattern kept (a block of each
    kind), the FFN-free and mixer-free lists renumbered, and the decoder's parameters the calculator's."""
    spec = load_hf_config(FIXTURES / f"{fixture}.json")
    kept = pick_layers(spec, 6)
    small = keep_layers(spec, kept)
    kinds = {layer_kind(small, i) for i in range(small.num_layers)}
    assert kinds == ({"mamba", "attention nope", "mlp"} if fixture == "nemotron-h-56b" else {"mamba", "attention nope",
                                                                                               "moe"})
    assert [layer_kind(small, i) for i in range(6)] == [layer_kind(spec, old) for old in kept]
    assert set(small.ffn_free_layers) | set(small.mixer_free_layers) == set(range(6))
    assert "mamba" in describe_layers(spec, kept)
    model = build_model(spec, layers=6, device="meta")
    assert sum(p.numel() for p in model.parameters()) == count_params(model.spec).total_params


def test_nano_scaled_down_runs_like_the_profiler() -> None:
    """What `tfcalc profile --layers 4 --hidden 128 --intermediate 256 --vocab 1024 --experts 16` builds of the Nano
    config: Mamba-2, MoE and attention blocks that prefill 64 tokens and decode 4 with the logits of one prefill."""
    spec = load_hf_config(FIXTURES / "nemotron-3-nano-30b-a3b.json")
    model = build_model(spec, layers=4, hidden=128, intermediate=256, vocab=1024, experts=16, seed=0)
    assert {layer_kind(model.spec, i) for i in range(4)} == {"mamba", "attention nope", "moe"}
    model.setup_caches(batch=1, max_len=68)
    tokens = torch.randint(1, 1024, (1, 68), generator=torch.Generator().manual_seed(0))
    full = run_in_chunks(model, tokens, [68])
    decoded = run_in_chunks(model, tokens, [64, 1, 1, 1, 1])
    assert (decoded - full).abs().max() < 1e-4 * full.abs().max()


# --- against transformers -----------------------------------------------------------------------------------------


def _copy_mamba(ours: Mamba2Mixer, hf: Any) -> None:
    for name in ("in_proj", "out_proj"):
        getattr(hf, name).weight.copy_(getattr(ours, name).weight)
        if getattr(ours, name).bias is not None:
            getattr(hf, name).bias.copy_(getattr(ours, name).bias)
    hf.conv1d.weight.copy_(ours.conv_weight[:, None])
    hf.conv1d.bias.copy_(ours.conv_bias)
    for name in ("dt_bias", "A_log", "D"):
        getattr(hf, name).copy_(getattr(ours, name))
    hf.norm.weight.copy_(ours.norm.weight)


def _copy_to_hf(ours: Transformer, hf: Any) -> None:
    """Embedding, head, final norm; per block its norm and its one mixer or FFN: Mamba-2 weight for weight, wqkv split
    into q/k/v_proj, an MLP's up/down_proj, an MoE's router (weight, score-correction bias), expert stacks
    (transformers: up_proj [E, I, hidden], down_proj [E, hidden, I]) and shared expert."""
    hf.model.embeddings.weight.copy_(ours.tok_embeddings.weight)
    hf.lm_head.weight.copy_(ours.lm_head.weight)
    hf.model.norm_f.weight.copy_(ours.norm.weight)
    for block, layer in zip(ours.layers, hf.model.layers, strict=True):
        mixer, ffn = block.attention, block.ffn
        layer.norm.weight.copy_((block.attention_norm if mixer is not None else block.ffn_norm).weight)
        if isinstance(mixer, Mamba2Mixer):
            _copy_mamba(mixer, layer.mixer)
        elif isinstance(mixer, Attention):
            q_out, kv_out = mixer.heads * mixer.head_dim, mixer.kv_heads * mixer.head_dim
            for name, w in zip(("q_proj", "k_proj", "v_proj"), mixer.wqkv.weight.split([q_out, kv_out, kv_out]),
                               strict=True):
                getattr(layer.mixer, name).weight.copy_(w)
            layer.mixer.o_proj.weight.copy_(mixer.wo.weight)
        elif isinstance(ffn, MoE):
            moe = layer.mixer
            moe.gate.weight.copy_(ffn.router.weight)
            moe.gate.e_score_correction_bias.copy_(ffn.score_bias)
            moe.experts.up_proj.copy_(ffn.w_in)
            moe.experts.down_proj.copy_(ffn.w_out)
            moe.shared_experts.up_proj.weight.copy_(ffn.shared.w_in.weight)
            moe.shared_experts.down_proj.weight.copy_(ffn.shared.w_out.weight)
            if ffn.latent_in is not None:  # Nemotron 3 Super's latent MoE
                moe.fc1_latent_proj.weight.copy_(ffn.latent_in.weight)
                moe.fc2_latent_proj.weight.copy_(ffn.latent_out.weight)
        else:
            assert isinstance(ffn, FeedForward)
            layer.mixer.up_proj.weight.copy_(ffn.w_in.weight)
            layer.mixer.down_proj.weight.copy_(ffn.w_out.weight)


def _nemotron_twin(transformers: Any, config: dict) -> tuple[Transformer, Any]:
    """Our float32 decoder from a small config.json and transformers' NemotronHForCausalLM of it with our weights;
    every 1-D weight drawn away from its default so that it matters (norms, the gated norm, D and the biases in
    [0.5, 1.5], dt_bias in [-1, 1], A_log in [-2, 1], the router's score-correction bias in [-0.1, 0.1])."""
    ours, hf = twin_models(transformers, config, torch.float32)
    with torch.no_grad():
        for p in ours.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
        for block in ours.layers:
            if isinstance(block.attention, Mamba2Mixer):
                block.attention.dt_bias.uniform_(-1.0, 1.0)
                block.attention.A_log.uniform_(-2.0, 1.0)
            if isinstance(block.ffn, MoE):
                block.ffn.score_bias.uniform_(-0.1, 0.1)
        _copy_to_hf(ours, hf)
    return ours, hf


def _tokens(vocab: int) -> torch.Tensor:
    return torch.randint(1, vocab, (2, TOTAL), generator=torch.Generator().manual_seed(1))


def _relative_differences(ours: Transformer, hf: Any) -> dict[str, float]:
    """max |our logits - transformers' full forward| / max |transformers' logits| per run of :data:`RUNS`."""
    tokens = _tokens(ours.spec.vocab_size)
    with torch.inference_mode():
        scale = float(hf(tokens).logits.abs().max())
    return {name: d / scale for name, d in logit_differences(ours, hf, tokens, RUNS, max_len=24).items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_nemotron_h_equals_transformers_with_the_same_weights(name: str) -> None:
    """Nano-like (Mamba-2, MoE, attention), Nemotron-H-like (Mamba-2, MLP, attention) and the latter with Mamba-2's
    in_proj / out_proj biases, in float32 with transformers' weights: the same logits for a 21-token prefill (our
    chunked scan against transformers' over three 8-token chunks), a 10-token prefill then 11 decode steps (the
    recurrence) and prefill chunks continuing the states; bound 1e-5 of the largest logit (~2), measured 2.7-5.6e-7
    (transformers on the CPU runs its torch reference: causal_conv1d_fn, mamba2_chunk_scan, selective_state_update)."""
    transformers = pytest.importorskip("transformers")
    ours, hf = _nemotron_twin(transformers, CONFIGS[name])
    assert [layer.block_type for layer in hf.model.layers] == [
        {"M": "linear_attention", "*": "full_attention", "E": "moe", "-": "mlp"}[letter]
        for letter in CONFIGS[name]["hybrid_override_pattern"]]
    differences = _relative_differences(ours, hf)
    assert max(differences.values()) < 1e-5, differences


class _NormBeforeGate(torch.nn.Module):
    """Qwen3-Next's order (w * rmsnorm(x) * silu(z), transformers Qwen3NextRMSNormGated) over the same groups."""

    def __init__(self, norm: GroupedGatedRMSNorm) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        groups = x.unflatten(-1, (-1, self.norm.group_size))
        normed = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.norm.eps)).flatten(-2)
        return self.norm.weight * (normed * torch.nn.functional.silu(z)).to(z.dtype)


def _mutate(ours: Transformer, hf: Any, change: str) -> None:
    """Leave one feature out of our model (or put relu in transformers' MLPs and experts for ``relu``)."""
    for block, layer in zip(ours.layers, hf.model.layers, strict=True):
        mixer = block.attention
        if isinstance(mixer, Mamba2Mixer):
            if change == "one norm group":
                mixer.norm.group_size = mixer.inner
            elif change == "no D skip":
                mixer.D.zero_()
            elif change == "no conv bias":
                mixer.conv_bias = None
            elif change == "dt without its bias":
                mixer.dt_bias.zero_()
            elif change == "norm before the gate":
                mixer.norm = _NormBeforeGate(mixer.norm)
        elif isinstance(mixer, Attention) and change == "rope":
            mixer.rotary = True
        elif mixer is None and change == "relu":
            mlps = [layer.mixer.experts, layer.mixer.shared_experts] if block.ffn.__class__ is MoE else [layer.mixer]
            for mlp in mlps:
                mlp.act_fn = torch.nn.ReLU()


@pytest.mark.parametrize("name, change", [
    ("nemotron_h", "one norm group"), ("nemotron_h", "no D skip"), ("nemotron_h", "no conv bias"),
    ("nemotron_h", "dt without its bias"), ("nemotron_h", "norm before the gate"), ("nemotron_h", "rope"),
    ("nemotron_h", "relu"), ("nano", "relu")])
def test_each_nemotron_feature_moves_the_logits(name: str, change: str) -> None:
    """Without one of its features (the gated norm's groups, the gate before the norm, the D skip, the conv bias,
    dt_bias, no RoPE on attention, relu^2 rather than relu in the MLPs and experts) our model is far from
    transformers' (more than 1e-3 of the largest logit in every run; measured 2.3-125 %), against 1e-5 with all of
    them."""
    transformers = pytest.importorskip("transformers")
    ours, hf = _nemotron_twin(transformers, CONFIGS[name])
    with torch.no_grad():
        _mutate(ours, hf, change)
    differences = _relative_differences(ours, hf)
    assert min(differences.values()) > 1e-3, differences


def test_an_unknown_block_letter_is_refused() -> None:
    with pytest.raises(Exception, match="hybrid_override_pattern"):
        spec_from_hf_config({**SMALL_NEMOTRON_H, "hybrid_override_pattern": "M-M*-X"}, "small", "bad")
