"""Nemotron-H (Mamba-2, attention, MLP and MoE blocks, one mixer or FFN each): counts, cache, work and the latency
model's layer census against hand counts."""

from __future__ import annotations

import pytest

from tfcalc.calc.kv_cache import kv_bytes_per_token, state_exact_bytes_per_sequence
from tfcalc.calc.latency import StepShape, _stages, deployment, step_time
from tfcalc.calc.params import count_params
from tfcalc.calc.work import decode_work, make_model, prefill_work
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import SpecError
from tfcalc.spec.hf_config import spec_from_hf_config
from tfcalc.spec.presets import load_engine, load_gpu, load_model

BF16 = get_dtype("bf16")
W16 = parse_weight_precision("bf16")


def test_blocks_hold_one_mixer_or_one_ffn() -> None:
    """Nano: 23 Mamba-2 + 6 attention blocks without an FFN, 23 MoE blocks without a mixer; 56B: 54 MLP blocks."""
    nano, big = load_model("nemotron-3-nano-30b-a3b"), load_model("nemotron-h-56b")
    assert (nano.num_linear_layers, nano.num_attention_layers, nano.num_moe_layers) == (23, 6, 23)
    assert nano.num_dense_mlp_layers == 0 and count_params(nano).total["mlp"].total == 0
    assert (big.num_linear_layers, big.num_attention_layers, big.num_dense_mlp_layers) == (54, 10, 54)
    assert count_params(big).total["mlp"].total == 54 * 2 * 8192 * 32768
    # one RMSNorm of 8192 per block, Mamba-2's gated norm over d_inner (256 x 64), the final norm
    assert count_params(big).total["norms"].total == 118 * 8192 + 54 * 256 * 64 + 8192


def test_mamba2_layer_params_by_hand() -> None:
    """Nemotron-H 56B's Mamba-2 mixer: in_proj 8192 x (2 x 16384 + 2 x 8 x 256 + 256), out_proj 16384 x 8192, the
    conv's 20480 x 4 taps and 20480 biases, dt_bias, A_log and D of 256 each (transformers NemotronHMamba2Mixer)."""
    big = load_model("nemotron-h-56b")
    per_layer = (8192 * (2 * 16384 + 2 * 8 * 256 + 256) + 16384 * 8192 + 20480 * 4 + 20480 + 3 * 256)
    attention = 10 * (8192 * 64 * 128 * 2 + 2 * 8192 * 8 * 128)
    assert count_params(big).total["attention"].total == 54 * per_layer + attention


def test_cache_and_states_by_hand() -> None:
    """Nano: 6 attention layers x 2 KV heads x 128 x K,V x 2 B = 6,144 B per token; each sequence's 23 Mamba-2 states:
    conv (4096 + 2 x 8 x 128) x 3 in bf16 + 64 heads x 64 x 128 in fp32."""
    nano = load_model("nemotron-3-nano-30b-a3b")
    assert kv_bytes_per_token(nano, BF16) == 6144
    assert state_exact_bytes_per_sequence(nano) == 23 * (6144 * 3 * 2 + 64 * 64 * 128 * 4)


def test_work_counts_attention_only_where_a_mixer_attends() -> None:
    """Decode FLOPs grow with the context by the 6 attention layers' 4 x 32 heads x 128 per key, bytes by their K and
    V; Mamba-2 and MoE blocks add nothing per cached token."""
    m = make_model(load_model("nemotron-3-nano-30b-a3b"), W16, BF16)
    near, far = decode_work(m, 1, 1000), decode_work(m, 1, 3000)
    assert far.flops - near.flops == 6 * 2000 * 4 * 32 * 128
    assert far.bytes - near.bytes == 6 * 2000 * 2 * 2 * 128 * 2
    assert prefill_work(m, 1, 1000).flops < prefill_work(m, 1, 2000).flops


def test_latency_census_and_block_kinds() -> None:
    """The latency model's layers of each kind: Mamba-2 and attention without an FFN, MoE blocks without a mixer."""
    nano = load_model("nemotron-3-nano-30b-a3b")
    (stage,) = _stages(nano, 1)
    assert dict(((k, f), n) for k, f, n, _ in stage.counts) == {("linear", None): 23, ("full", None): 6,
                                                               ("none", True): 23}
    d = deployment(nano, load_gpu("h100-sxm"), W16, BF16, engine_kernels=load_engine("vllm-0.21").kernels)
    near = step_time(d, StepShape(decode_seqs=8, decode_context=1000))
    far = step_time(d, StepShape(decode_seqs=8, decode_context=9000))
    assert far.kv_read_bytes - near.kv_read_bytes == pytest.approx(8 * 8000 * 6 * 1024)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_decode_step_shrinks_with_tp_in_ideal_mode(tp: int) -> None:
    spec = load_model("nemotron-h-56b")
    step = [step_time(deployment(spec, load_gpu("h100-sxm"), W16, BF16, tp=t), StepShape(decode_seqs=4,
                                                                                        decode_context=2000),
                      ideal=True).seconds for t in (tp, 2 * tp)]
    assert step[1] < step[0]


def test_bad_patterns_are_refused() -> None:
    import json
    from pathlib import Path

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
    nano = json.loads((fixtures / "nemotron-3-nano-30b-a3b.json").read_text())
    with pytest.raises(SpecError, match="hybrid_override_pattern"):
        spec_from_hf_config({**nano, "hybrid_override_pattern": "MEX"}, "t", "t")


def test_latent_moe_by_hand() -> None:
    """Nemotron 3 Super: 512 relu^2 experts of 2688 on a latent of 1024 (up and down, 2 x 1024 x 2688 each) and the
    two latent projections 4096 x 1024 per MoE block, whole on every GPU; 22 experts per token."""
    from pathlib import Path

    from tfcalc.calc.plan import check_parallelism
    from tfcalc.calc.shard import shard
    from tfcalc.spec.hf_config import load_hf_config

    spec = load_hf_config(Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
                          / "nemotron-3-super-120b-a12b.json")
    layers = spec.num_moe_layers
    expert, latent = 2 * 1024 * 2688, 2 * 4096 * 1024
    counts = count_params(spec)
    assert counts.total["experts"].total == layers * (512 * expert + latent)
    assert counts.active["experts"].total == layers * (22 * expert + latent)
    sh = shard(spec, check_parallelism(spec, 4, 4, 1, 1))
    assert sh.latent.total == latent and sh.expert.total == expert // 4
    # a token's matmul elements in an MoE block: 22 experts at the latent width, the latent projections, the shared
    # expert (4096 x 5376 up and down) and the router (512 x 4096)
    from tfcalc.calc.work import _layer_linear

    m = make_model(spec, W16, BF16)
    moe_layer = next(i for i in range(spec.num_layers) if spec.is_moe_layer(i))
    elements, _ = _layer_linear(m, moe_layer, 1)
    assert elements == 22 * expert + latent + 2 * 4096 * 5376 + 512 * 4096
