"""Kimi Linear (model_type kimi_linear) and Kimi K3 (kimi_k3): Kimi Delta Attention (KDA) beside NoPE MLA.

Kimi Linear's count is compared with transformers in tests/calc/test_params_hf_parity.py; here with its checkpoint's
published total. Kimi K3 has no transformers class, so its count is checked against a brute-force count written here
tensor by tensor from vLLM 0.34's model code (vllm/models/kimi_k3/nvidia/*.py, kimi_k25_vit.py), and its KV and
state bytes against a hand computation."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from hf_fixtures import build, fixture
from typer.testing import CliRunner

from tfcalc.calc.kv_cache import kv_bytes_per_token, state_exact_bytes_per_sequence
from tfcalc.calc.params import count_params
from tfcalc.cli import app
from tfcalc.dtypes import get_dtype
from tfcalc.errors import SpecError
from tfcalc.model.transformer import TransformerBlock

LINEAR, K3 = "kimi-linear-48b-a3b", "kimi-k3"
BF16 = get_dtype("bf16")


def _kda(h: int, heads: int, d: int, kernel: int, full_rank_gate: bool) -> int:
    """One KDA layer's tensors but its o_norm [d] (counted with the norms). Kimi K3 (vLLM kimi_k3/nvidia/kda.py
    KimiK3DeltaAttention): in_proj_qkvgfab [h, 4P + d + heads] (q, k, v, g, f_a, b), f_b_proj [d, P], dt_bias [P],
    conv1d [3P, 1, kernel], A_log [heads], o_proj [P, h]. Kimi Linear (vLLM kimi_gdn_linear_attn.py): in_proj
    [h, 3P + heads + d] and the low-rank gate g_a_proj [h, d], g_b_proj [d, P] instead of g. P = heads x d."""
    p = heads * d
    gate = h * p if full_rank_gate else h * d + d * p
    return h * (3 * p + d + heads) + gate + d * p + p + 3 * p * kernel + heads + p * h


def _k3_brute_force(cfg: dict[str, Any]) -> dict[str, int]:
    """Kimi K3's parameters by part, tensor by tensor from vLLM 0.34's classes (t: its text_config)."""
    t, v = cfg["text_config"], cfg["vision_config"]
    h, n, heads = t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"]
    la = t["linear_attn_config"]
    kda_layers = {i - 1 for i in la["kda_layers"]}
    q_rank, kv_rank, rope = t["q_lora_rank"], t["kv_lora_rank"], t["qk_rope_head_dim"]
    nope, vd = t["qk_nope_head_dim"], t["v_head_dim"]
    # kimi_k3/nvidia/mla.py MultiHeadLatentAttention: fused_qkv_a_g_proj [h, q_rank + kv_rank + rope + heads v]
    # (KimiK3MergedQKVGateLinear), q_a_layernorm [q_rank], q_b_proj [q_rank, heads (nope + rope)], kv_a_layernorm
    # [kv_rank], kv_b_proj [kv_rank, heads (nope + v)], o_proj [heads v, h]
    # (its two norms, and KDA's o_norm, are counted with the norms below)
    mla = (h * (q_rank + kv_rank + rope + heads * vd) + q_rank * heads * (nope + rope)
           + kv_rank * heads * (nope + vd) + heads * vd * h)
    kda = _kda(h, la["num_heads"], la["head_dim"], la["short_conv_kernel_size"], la["use_full_rank_gate"])
    e, m, latent, shared = t["num_experts"], t["moe_intermediate_size"], t["routed_expert_hidden_size"], \
        t["num_shared_experts"]
    # kimi_k3/nvidia/model.py KimiMoE: gate [h, E] and e_score_correction_bias [E]; shared_experts a KimiMLP of
    # shared x moe_intermediate_size (gate_up [h, 2 I], down [I, h]); routed_expert_down_proj [h, L],
    # routed_expert_norm [L], routed_expert_up_proj [L, h]; E experts of w13 [2 m, L] and w2 [L, m] (FusedMoE)
    router = h * e + e
    shared_mlp = 3 * h * shared * m
    latent_part = 2 * h * latent + latent
    experts = e * 3 * latent * m
    dense_mlp = 3 * h * t["intermediate_size"]  # KimiMLP on the first_k_dense_replace layers
    # KimiDecoderLayer: input_layernorm, post_attention_layernorm; attention residuals: self_attention_res_norm,
    # mlp_res_norm [h] and self_attention_res_proj, mlp_res_proj [1, h] (ReplicatedLinear(h, 1))
    per_layer_norms = 2 * h + 4 * h
    dense = t["first_k_dense_replace"]
    parts = {"attention": sum(kda if i in kda_layers else mla for i in range(n)),
             "mlp": dense * dense_mlp, "router": (n - dense) * router,
             "shared_experts": (n - dense) * shared_mlp, "experts": (n - dense) * (experts + latent_part),
             # embed_tokens, lm_head (ParallelLMHead, untied); KimiLinearModel: norm, output_attn_res_norm [h],
             # output_attn_res_proj [1, h]
             "embedding": t["vocab_size"] * h, "lm_head": t["vocab_size"] * h,
             "norms": n * per_layer_norms + 3 * h + len(kda_layers) * la["head_dim"]
             + (n - len(kda_layers)) * (q_rank + kv_rank)}
    # kimi_k25_vit.py MoonViT3dPretrainedModel with KimiK3VisionConfig: patch_embed.proj conv [vh, 3, p, p] (no
    # bias), pos_emb weight [64, 64, vh] (its time_weight a non-persistent buffer); per block norm0, norm1 RMSNorm
    # [vh], wqkv [vh, 3 a], wo [a, vh], mlp fc0 [vh, I], fc1 [I, vh], no biases; final_layernorm [vh];
    # KimiK25MultiModalProjector patchmergerv2: linear_1 [4 vh, 4 vh], linear_2 [4 vh, H], post_norm [H]
    vh, a, vi, p = v["vt_hidden_size"], v["qkv_hidden_size"], v["vt_intermediate_size"], v["patch_size"]
    wide = v["merge_kernel_size"][0] * v["merge_kernel_size"][1] * vh
    parts["encoder"] = (3 * p * p * vh + v["init_pos_emb_height"] * v["init_pos_emb_width"] * vh
                        + v["vt_num_hidden_layers"] * (2 * vh + 3 * vh * a + a * vh + 2 * vh * vi) + vh
                        + wide * wide + wide * h + h)
    return parts


def test_kimi_linear_total_is_the_checkpoints() -> None:
    """moonshotai/Kimi-Linear-48B-A3B-Instruct's safetensors hold 49,122,681,728 parameters (the fixture's source
    report); its model card says 48B total, 3B activated."""
    counts = count_params(build(LINEAR))
    assert counts.total_params == 49_122_681_728
    assert round(counts.active_params / 1e9) == 3


def test_kimi_linear_layers_are_one_based_in_the_config() -> None:
    """linear_attn_config's full_attn_layers [4, 8, ..., 24, 27] are layers 3, 7, ..., 23, 26 (transformers
    KimiLinearConfig: layer_types[layer - 1]); the rest run KDA."""
    spec = build(LINEAR)
    assert spec.linear_attention is not None and spec.linear_attention.kind == "kda"
    full = tuple(i for i in range(spec.num_layers) if not spec.is_linear_layer(i))
    assert full == (3, 7, 11, 15, 19, 23, 26)
    assert spec.moe is not None and spec.moe.dense_layers == (0,) and spec.mla is not None


def test_kimi_linear_kv_and_state_by_hand() -> None:
    """7 MLA layers cache kv_lora_rank + qk_rope_head_dim = 576 bf16 values per token; each of the 20 KDA layers
    holds conv states 3 x 32 x 128 x (4 - 1) in bf16 and 32 heads x 128 x 128 in float32 per request (vLLM
    MambaStateShapeCalculator.kda_state_shape, kda_state_dtype)."""
    spec = build(LINEAR)
    assert kv_bytes_per_token(spec, BF16) == 7 * 576 * 2
    assert state_exact_bytes_per_sequence(spec) == 20 * (3 * 4096 * 3 * 2 + 32 * 128 * 128 * 4)


def test_kimi_k3_counts_equal_the_brute_force() -> None:
    counts = count_params(build(K3))
    expected = _k3_brute_force(fixture(K3))
    assert {c: counts.total[c].total for c in expected} == expected
    assert counts.total_params == sum(expected.values())


def test_kimi_k3_kv_and_state_by_hand() -> None:
    """24 MLA layers of 576 bf16 values per token; 69 KDA layers of conv states 3 x 96 x 128 x 3 (bf16) and
    96 x 128 x 128 float32 recurrent states per request."""
    spec = build(K3)
    assert spec.linear_attention is not None and spec.num_linear_layers == 69
    assert kv_bytes_per_token(spec, BF16) == 24 * 576 * 2
    assert state_exact_bytes_per_sequence(spec) == 69 * (3 * 12288 * 3 * 2 + 96 * 128 * 128 * 4)


def test_kimi_k3_reads_its_parts() -> None:
    """The last two layers (92 and 93, 1-based) are both MLA; the routed experts (not the ignored attention, shared
    experts, dense MLP and lm_head) are MXFP4; the decoder is read as kimi_linear, from the checkpoint's own code."""
    spec = build(K3)
    assert not spec.is_linear_layer(91) and not spec.is_linear_layer(92) and spec.is_linear_layer(90)
    assert spec.native_dtype == "experts=mxfp4,default=bf16"
    assert spec.moe is not None and (spec.moe.latent_size, spec.moe.latent_norm) == (3584, True)
    assert spec.attention_output_gate and spec.attention_residual_block == 12 and spec.activation == "situ"
    assert spec.remote_code and spec.encoder is not None and spec.encoder.attention_width == 1536


def test_kimi_k3_mxfp4_experts_are_not_weight_only() -> None:
    """Its MXFP4 group has no input_activations, yet the routed experts are not a weight-only component: vLLM's
    compressed-tensors MoE takes an MXFP4 group by its weights alone (CompressedTensorsW4A4Mxfp4MoEMethod) and
    SGLang quantises their inputs to MXFP8; a dense MLP in that group would be (CompressedTensorsW4A16Mxfp4)."""
    assert build(K3).checkpoint_weight_only == ()
    quant = fixture(K3)["text_config"]["quantization_config"]
    everything = {**quant, "ignore": []}
    text = {**fixture(K3)["text_config"], "quantization_config": everything}
    assert build(K3, text_config=text).checkpoint_weight_only == ("attention", "mlp", "shared_experts")


@pytest.mark.parametrize(("name", "changes", "message"), [
    (LINEAR, {"linear_attn_config": {"kda_layers": [1, 2], "full_attn_layers": [4]}}, "name each of the layers"),
    (LINEAR, {"moe_router_activation_func": "softmax"}, "moe_router_activation_func"),
    (LINEAR, {"dsa_config": {"index_topk": 2048}}, "DSA"),
])
def test_unsupported_configs_are_refused_in_one_line(name: str, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        build(name, **changes)
    assert "\n" not in str(info.value)


def test_the_bundled_model_refuses_kda() -> None:
    with pytest.raises(SpecError, match="Kimi Delta Attention"):
        TransformerBlock(build(LINEAR), 0)


@pytest.mark.parametrize("name", [LINEAR, K3])
@pytest.mark.parametrize("command", [
    ["params"], ["kv-cache", "--context", "128k"], ["plan", "-g", "b200", "-n", "16", "--max-model-len", "32k"],
    ["estimate", "-g", "b200", "--tp", "16", "-b", "4", "--prompt-len", "2k", "--gen-len", "256"]])
def test_cli_runs_on_both(name: str, command: list[str]) -> None:
    from hf_fixtures import FIXTURE_DIR

    result = CliRunner().invoke(app, [*command, "--config", str(FIXTURE_DIR / f"{name}.json")])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output


def test_mxfp4_latent_experts_pad_their_latent_width() -> None:
    """vLLM pads MXFP4 experts' width to a multiple of 256 and each rank's intermediate to one of 128 (its preset's
    mxfp4_pad_*): a latent MoE's experts run on the latent (3,584, already a multiple), their 3,072 / 16 = 192 per
    rank at tp 16 padded to 256."""
    from tfcalc.calc.plan import _engine_shard
    from tfcalc.calc.shard import Parallelism
    from tfcalc.dtypes import parse_weight_precision
    from tfcalc.spec.presets import load_engine

    spec = build(K3)
    sh, _, padded = _engine_shard(spec, Parallelism(tp=16), load_engine("vllm-0.21"),
                                  parse_weight_precision(spec.native_dtype))
    assert padded == (3584, 256)
    assert sh.expert.matrix == 3 * 3584 * 256


def test_the_bundled_model_refuses_kimi_k3s_parts() -> None:
    """K3's MLA layer 3 (after its KDA layers) names what the bundled decoder lacks."""
    with pytest.raises(SpecError, match="SiTU activation, gated MLA, attention residuals, latent-MoE norm"):
        TransformerBlock(build(K3), 3)


def test_nope_mla_holds_no_rotary_cache() -> None:
    """Kimi's MLA turns no RoPE (transformers KimiLinearAttention; vLLM MultiHeadLatentAttention use_rope False), so
    vLLM builds no cos/sin cache for it."""
    from tfcalc.calc.plan import _rotary_cache_elements

    for name in (LINEAR, K3):
        spec = build(name)
        assert set(spec.nope_layers) == {i for i in range(spec.num_layers) if not spec.is_linear_layer(i)}
        assert _rotary_cache_elements(spec) == 0


def _k3_moe_layer_by_hand(t: dict[str, Any], tp: int) -> tuple[Fraction, Fraction]:
    """(routed experts on one GPU, the rest of one MoE layer there) in bytes, from K3's text_config: the routed
    experts MXFP4 (4 bits + one 8-bit scale per 32 values = 17/32 bytes), sliced tp ways; shared experts bf16,
    split over tp; router [h, E] and its bias [E] whole, 16-bit; the latent projections [h, L] and [L, h] and their
    norm [L] whole and bf16 (SGLang kimi_k3.py KimiK3MoE, vLLM kimi_k3/nvidia/model.py KimiMoE:
    ReplicatedLinear(quant_config=None); aiconfigurator sdk/models/kimi_k3.py latent_down/up GEMMs bf16)."""
    h, e, m, latent = (t["hidden_size"], t["num_experts"], t["moe_intermediate_size"],
                       t["routed_expert_hidden_size"])
    experts = e * 3 * latent * (m // tp) * Fraction(17, 32)
    shared = 3 * h * (t["num_shared_experts"] * m // tp) * 2
    return experts, shared + (h * e + e) * 2 + (2 * h * latent + latent) * 2


def test_kimi_k3_moe_weights_per_gpu_at_tp8_by_hand() -> None:
    """The 92 MoE layers' weights on one GPU at tp 8: two stage censuses of 92 KDA layers, with and without their
    MoE, differ by exactly the hand count; the latent part alone is 9,454,620,672 bytes per GPU (in the experts'
    MXFP4 it would be 2.51 GB)."""
    from tfcalc.calc.shard import Parallelism, StageCensus, census_weight_bytes, shard
    from tfcalc.dtypes import parse_weight_precision

    spec, t = build(K3), fixture(K3)["text_config"]
    n = t["num_hidden_layers"] - t["first_k_dense_replace"]
    precision, sh = parse_weight_precision(spec.native_dtype), shard(spec, Parallelism(tp=8))
    with_moe = StageCensus(layers=n, moe_layers=n, sliding_layers=0, linear_layers=n)
    without = StageCensus(layers=n, moe_layers=0, sliding_layers=0, linear_layers=n, ffn_free_layers=n)
    with_moe_bytes, without_bytes = (census_weight_bytes(spec, sh, precision, c, (), False, False)
                                     for c in (with_moe, without))
    experts, rest = _k3_moe_layer_by_hand(t, 8)
    assert with_moe_bytes - without_bytes == n * (experts + rest)
    assert n * (2 * t["hidden_size"] * 3584 + 3584) * 2 == 9_454_620_672


def test_kimi_k3_memory_counts_the_latent_in_bf16() -> None:
    """``tfcalc memory``'s experts component: the routed experts in MXFP4 and the latent projections in bf16, total
    and per token (every token passes the latent)."""
    from tfcalc.calc.memory import weights_bytes_by_component
    from tfcalc.dtypes import parse_weight_precision

    spec, t = build(K3), fixture(K3)["text_config"]
    n, e, k = t["num_hidden_layers"] - t["first_k_dense_replace"], t["num_experts"], t["num_experts_per_token"]
    h, m, latent = t["hidden_size"], t["moe_intermediate_size"], t["routed_expert_hidden_size"]
    expert, projections = 3 * latent * m * Fraction(17, 32), (2 * h * latent + latent) * 2
    counts, precision = count_params(spec), parse_weight_precision(spec.native_dtype)
    for active, experts in ((False, e), (True, k)):
        got = weights_bytes_by_component(counts, precision, active, spec)["experts"]
        assert got == math.ceil(n * (experts * expert + projections))
