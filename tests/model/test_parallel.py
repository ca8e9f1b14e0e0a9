"""The sharded decoder (``tfcalc.model.parallel``) on 2 and 4 CPU ranks (gloo): every rank's logits equal the
one-rank model's (fp32; tolerance 1e-5 of the largest logit, measured 2-4e-7: the sums only change order), prefill
and cached decode, for dense GQA with tp above the KV heads, soft caps and windows, qkv biases, sinks with expert
biases, MLA, MoE sliced by tp, placed by ep and dispatched by all-to-all, Gated DeltaNet layers split by key head
with gated attention (Qwen3-Next, Qwen3.5), Nemotron-H's blocks of one Mamba-2 mixer (split by head, its B/C groups
split or replicated), attention, MLP or MoE; each rank holds exactly what ``tfcalc plan`` counts per GPU.

FP8 weights (quantized whole, each rank keeping its slice and the matching scales) run in fp64 on the dequantized
path: there a change of summation order (1e-16) never moves an activation across an FP8 rounding boundary, as it
does in fp32 (one flipped E4M3 rounding moves an element by 1/16; measured 4e-4 of the largest logit for the dense
fp8_block case in fp32). Block scales: the sharded logits equal the one-rank FP8 model's (tolerance 1e-12, measured
5-7e-16). Per-tensor scales: a row-parallel layer (o, down) quantizes its activation slice per token with the
slice's own amax, as vLLM's dynamic per-token quantization does on each rank, so the logits differ from the one-rank
model's by FP8 activation rounding (measured 1.8 % of the largest logit, as FP8 differs from float), bound 5 %; the
weights themselves slice exactly (tests/model/test_fp8.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import small_spec
from shard_jobs import Case, CompareWithOneRank
from small_configs import (
    SMALL_GEMMA4,
    SMALL_GEMMA4_MOE,
    SMALL_LLAMA4,
    SMALL_LLAMA4_INTERLEAVED,
    SMALL_MINIMAX_M2,
    SMALL_NEMOTRON_H,
    SMALL_NEMOTRON_NANO,
    SMALL_NEMOTRON_SUPER,
    SMALL_QWEN3_5,
    SMALL_QWEN3_NEXT,
    small_config_spec,
)

from tfcalc.calc.plan import PlanConfig, plan_fit
from tfcalc.dtypes import WeightPrecision, get_dtype
from tfcalc.errors import UsageError
from tfcalc.model import build_model
from tfcalc.model.parallel import Collectives, Parallel, check_sharding, weight_bytes, world_size
from tfcalc.model.transformer import TransformerBlock, check_fp8_sharding
from tfcalc.profile.distributed import launch
from tfcalc.profile.sweep import weight_precision
from tfcalc.spec.model import MLASpec, ModelSpec
from tfcalc.spec.presets import load_gpu

TOLERANCE = 1e-5  # of the largest |logit|
FP8_TOLERANCE = {"fp8_block": 1e-12, "fp8": 5e-2}  # fp64 (module docstring)


def fp8_dense_spec() -> ModelSpec:
    """llama3-70b scaled down with every tp-2 slice on 128x128 blocks: 8 heads of 128 (one KV head, replicated),
    FFN 1024 (512 per rank), hidden 512 (whole scale rows: no padding)."""
    return small_spec("llama3-70b").with_overrides(hidden_size=512, head_dim=128, num_attention_heads=8,
                                                   num_kv_heads=1, intermediate_size=1024)


def fp8_mla_spec() -> ModelSpec:
    """deepseek-v3 scaled down (MLA, a dense layer, 8 routed experts and a shared one) with tp-2 slices on blocks:
    8 heads with qk 64 + 64 and v 128, latent and q rank 512, expert and shared widths 256; 2 layers (dense, MoE)."""
    mla = MLASpec(q_lora_rank=512, kv_lora_rank=512, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=128)
    spec = small_spec("deepseek-v3")
    assert spec.moe is not None
    moe = replace(spec.moe, expert_intermediate_size=256, shared_expert_intermediate_size=256)
    return spec.with_overrides(moe=moe, mla=mla, head_dim=mla.qk_head_dim, hidden_size=512, intermediate_size=1024,
                               num_attention_heads=8, num_kv_heads=8, num_layers=2)


def _case(make_spec, name: str, tp: int, ep: int, label: str = "", **changes: object) -> Case:  # noqa: ANN001
    spec = make_spec(name)
    if changes:
        spec = spec.with_overrides(**changes)
    return Case(label or f"{name} tp {tp} ep {ep}", spec, tp, ep)


def _run(cases: list[Case], ranks: int) -> dict[str, list[dict]]:
    got: list = []
    launch(CompareWithOneRank(tuple(cases)), ranks, "cpu", lambda kind, payload: got.append(payload))
    by_case: dict[str, list[dict]] = {}
    for result in got[0]:
        by_case.setdefault(result["case"], []).append(result)
    return by_case


def _two_rank_cases(small_spec) -> list[Case]:  # noqa: ANN001
    return [
        _case(small_spec, "llama3-8b", 2, 1),  # 4 query heads, 1 KV head: the KV head replicated
        _case(small_spec, "llama3.2-1b", 2, 1, "vocab 129 padded", vocab_size=129),  # tied, last rank padded
        _case(small_spec, "qwen2.5-7b", 2, 1),  # qkv biases
        _case(small_spec, "gemma2-9b", 2, 1),  # soft caps, windows, (1 + w) norms, tied
        _case(small_spec, "gpt-oss-20b", 2, 1),  # sinks, expert biases sliced, windows
        _case(small_spec, "deepseek-v3", 2, 1),  # MLA by head, dense + MoE with a shared expert
        _case(small_spec, "mixtral-8x7b", 2, 2),  # experts placed by ep = tp
        _case(small_spec, "mixtral-8x7b", 1, 2),  # ep > tp: two replicas, tokens by all-to-all
        _case(small_spec, "deepseek-v3", 1, 2),  # ... with MLA, a dense layer and a shared expert
        Case("llama3-70b fp8 tp 2", fp8_dense_spec(), 2, 1, "fp8", torch.float64),
        Case("llama3-70b fp8_block tp 2", fp8_dense_spec(), 2, 1, "fp8_block", torch.float64),
        Case("deepseek-v3 fp8_block tp 2", fp8_mla_spec(), 2, 1, "fp8_block", torch.float64),  # experts sliced
        Case("deepseek-v3 fp8_block ep 2", fp8_mla_spec(), 1, 2, "fp8_block", torch.float64),  # experts placed
        Case("minimax_m2 tp 2", small_config_spec(SMALL_MINIMAX_M2), 2, 1),  # QK-norm across heads, partial RoPE
        # Gated DeltaNet (one key head and its two value heads per rank), gated attention, MoE with a gated shared
        # expert sliced by tp; Qwen3.5 dense with a tied head
        Case("qwen3_next tp 2", small_config_spec(SMALL_QWEN3_NEXT), 2, 1),
        Case("qwen3_5 tp 2", small_config_spec(SMALL_QWEN3_5), 2, 1),
        # Llama 4: chunk rings (decode crosses the chunk boundary at 8), NoPE layers' temperature, QK norm, experts
        # weighting their inputs sliced by tp, placed by ep, and dispatched by all-to-all with dense layers between
        Case("llama4 tp 2", small_config_spec(SMALL_LLAMA4), 2, 1),
        Case("llama4 interleaved tp 2 ep 2", small_config_spec(SMALL_LLAMA4_INTERLEAVED), 2, 2),
        Case("llama4 interleaved ep 2", small_config_spec(SMALL_LLAMA4_INTERLEAVED), 1, 2),
        # Gemma 4: global layers' own heads (their one KV head held by both ranks, no V rows), the dense MLP beside
        # the experts reduced on its own, the experts' own input norm through the all-to-all
        Case("gemma4 tp 2", small_config_spec(SMALL_GEMMA4), 2, 1),
        Case("gemma4 moe tp 2", small_config_spec(SMALL_GEMMA4_MOE), 2, 1),
        Case("gemma4 moe ep 2", small_config_spec(SMALL_GEMMA4_MOE), 1, 2),
        # Nemotron-H: blocks holding one mixer or one FFN, each reduced once; Mamba-2 heads 3 a rank with their one
        # B/C group, the conv and SSM states alike; relu^2 experts sliced by tp, placed by ep, dispatched by all-to-all
        Case("nemotron nano tp 2", small_config_spec(SMALL_NEMOTRON_NANO), 2, 1),
        Case("nemotron nano tp 2 ep 2", small_config_spec(SMALL_NEMOTRON_NANO), 2, 2),
        Case("nemotron nano ep 2", small_config_spec(SMALL_NEMOTRON_NANO), 1, 2),
        Case("nemotron-h tp 2", small_config_spec(SMALL_NEMOTRON_H), 2, 1),
        Case("nemotron super tp 2", small_config_spec(SMALL_NEMOTRON_SUPER), 2, 1),
        Case("nemotron super ep 2", small_config_spec(SMALL_NEMOTRON_SUPER), 1, 2),
    ]


def _four_rank_cases(small_spec) -> list[Case]:  # noqa: ANN001
    return [
        _case(small_spec, "deepseek-v3", 2, 4),  # ep > tp > 1: each tp rank dispatches its share of the tokens
        _case(small_spec, "deepseek-v3", 4, 2),  # ep < tp: 4 experts per rank, each sliced 2 ways
        _case(small_spec, "llama3-8b", 4, 1),
        # QK-norm across heads with the two KV heads (and their k-norm columns) each held by two ranks
        Case("minimax_m2 tp 4", small_config_spec(SMALL_MINIMAX_M2).with_overrides(num_attention_heads=8), 4, 1),
        Case("qwen3_5 tp 4", _wider_qwen3_5(), 4, 1),
        # Mamba-2 with 8 heads (2 a rank): 4 groups split one a rank; 2 groups (or 1) each held by the 2 (or 4) ranks
        # whose heads read it, the gated norm's sums over a group completed by an all-reduce (vLLM MambaMixer2). The
        # planner refuses groups that tp does not divide, so those two build without its checks.
        Case("nemotron-h tp 4 groups split", _wider_nemotron_h(4), 4, 1),
        Case("nemotron-h tp 4 groups replicated", _wider_nemotron_h(2), 4, 1, checked=False),
        Case("nemotron-h tp 4 one group", _wider_nemotron_h(1), 4, 1, checked=False),
    ]


def _wider_nemotron_h(groups: int) -> ModelSpec:
    """The small Nemotron-H with 8 Mamba-2 heads reading ``groups`` B/C groups and 8 query heads."""
    spec = small_config_spec(SMALL_NEMOTRON_H)
    assert spec.linear_attention is not None
    return spec.with_overrides(num_attention_heads=8, linear_attention=replace(
        spec.linear_attention, num_value_heads=8, num_key_heads=groups))


def _wider_qwen3_5() -> ModelSpec:
    """The small Qwen3.5 with 4 linear key heads (8 value heads) and 8 query heads: at tp 4 a rank keeps one key
    head, two value heads and two query heads, its KV head shared with another rank."""
    spec = small_config_spec(SMALL_QWEN3_5)
    assert spec.linear_attention is not None
    return spec.with_overrides(num_attention_heads=8, linear_attention=replace(
        spec.linear_attention, num_key_heads=4, num_value_heads=8))


def _check(cases: list[Case], results: dict[str, list[dict]]) -> None:
    for case in cases:
        ranks = results[case.name]
        assert len(ranks) == world_size(case.tp, case.ep), case.name
        tolerance = TOLERANCE if case.weights is None else FP8_TOLERANCE[case.weights]
        assert max(r["error"] for r in ranks) < tolerance, (case.name, ranks)
        spec, la = case.spec, case.spec.linear_attention
        halves = sum(spec.has_mixer(i) + spec.has_ffn(i) for i in range(spec.num_layers))  # each reduced once
        per_forward = (halves + 2 if case.tp > 1 else 0) + (
            3 * spec.num_moe_layers if case.ep > case.tp else 0) + (
            spec.num_layers if case.tp > 1 and spec.qk_norm_across_heads else 0) + (  # q and k norm statistics
            spec.num_moe_layers if case.tp > 1 and spec.moe is not None and spec.moe.dense_mlp_beside else 0) + (
            spec.num_linear_layers if la is not None and la.kind == "mamba2" and la.num_key_heads % case.tp else 0)
        assert {r["collectives"] for r in ranks} == {per_forward}, case.name
        if case.weights is not None or not case.checked:  # FP8 bytes: test_fp8_ranks_hold_what_the_plan_counts
            continue
        precision = WeightPrecision(get_dtype("fp32"))
        plan = plan_fit(case.spec, load_gpu("h100-sxm"), precision, get_dtype("fp32"),
                        PlanConfig(num_gpus=world_size(case.tp, case.ep), tp=case.tp, ep=case.ep))
        assert {r["params"] for r in ranks} == {plan.weights_bytes_per_gpu // 4}, case.name


def test_two_ranks_compute_the_one_rank_model(make_spec) -> None:  # noqa: ANN001
    cases = _two_rank_cases(make_spec)
    _check(cases, _run(cases, 2))


def test_four_ranks_compute_the_one_rank_model(make_spec) -> None:  # noqa: ANN001
    cases = _four_rank_cases(make_spec)
    _check(cases, _run(cases, 4))


@pytest.mark.parametrize("name, tp, ep, message", [
    ("llama3-8b", 3, 1, "tp 3 does not divide the 32 attention heads"),
    ("llama3-8b", 1, 2, "ep 2 given but llama3-8b has no experts"),
    ("mixtral-8x7b", 2, 3, "ep 3 must divide tp 2 or be a multiple of it"),
    ("mixtral-8x7b", 1, 16, "ep 16 does not divide the 8 experts"),
])
def test_shardings_the_planner_refuses_are_refused(name: str, tp: int, ep: int, message: str) -> None:
    from tfcalc.spec.presets import load_model

    with pytest.raises(UsageError, match=message):
        check_sharding(load_model(name), tp, ep)


def test_widths_that_do_not_split_are_refused() -> None:
    from tfcalc.spec.presets import load_model

    with pytest.raises(UsageError, match="does not divide the FFN width 100"):
        check_sharding(load_model("llama3-8b").with_overrides(intermediate_size=100), 8, 1)
    spec = small_config_spec(SMALL_QWEN3_5)
    assert spec.linear_attention is not None
    one_key_head = spec.with_overrides(linear_attention=replace(spec.linear_attention, num_key_heads=1))
    with pytest.raises(UsageError, match=r"^tp 2 does not divide the 1 key and \d+ value heads"):
        check_sharding(one_key_head, 2, 1)


def test_mamba_groups_neither_split_nor_whole_per_rank_are_refused() -> None:
    """6 Mamba-2 heads in 3 groups over tp 2: a rank's 3 heads would read parts of two groups (vLLM shards groups only
    where tp divides them or they are replicated), refused as the block is sharded."""
    spec = small_config_spec(SMALL_NEMOTRON_H)
    assert spec.linear_attention is not None
    spec = spec.with_overrides(linear_attention=replace(spec.linear_attention, num_key_heads=3))
    meta = torch.device("meta")
    par = Parallel(tp=2, ep=1, rank=0, world=2, comm=Collectives(meta))
    with torch.device(meta), torch.no_grad():
        block = TransformerBlock(spec, 0)
        with pytest.raises(UsageError, match="its 3 groups split evenly or each be held whole"):
            par.shard_block(block)


def _meta_shard(spec: ModelSpec, tp: int, ep: int, rank: int, weights: str) -> torch.nn.Module:
    """One rank's bf16 model with FP8 weights on the meta device (no memory, no process group)."""
    meta = torch.device("meta")
    par = Parallel(tp=tp, ep=ep, rank=rank, world=world_size(tp, ep), comm=Collectives(meta))
    return build_model(spec, dtype=torch.bfloat16, device=meta, weights_dtype=weights, parallel=par)


@pytest.mark.parametrize("weights, tp, ep", [("fp8", 2, 1), ("fp8_block", 2, 1), ("fp8", 4, 1),
                                             ("fp8_block", 4, 1)])
def test_fp8_ranks_hold_what_the_plan_counts(weights: str, tp: int, ep: int) -> None:
    """Each rank's FP8 matrices (one byte an element and their scales) plus its bf16 embedding, head and norms
    equal ``tfcalc plan``'s weights per GPU for the same tp and format; per-tensor scales add their 4 bytes a
    matrix, which the calculator leaves out (4 matrices a layer: qkv, o, gate/up, down). Widths on whole blocks
    (multiples of 512 per rank at tp 2; at tp 4 the down and o slices take a padded scale row: counted there)."""
    spec = fp8_dense_spec()
    plan = plan_fit(spec, load_gpu("h100-sxm"), weight_precision("bf16", weights), get_dtype("bf16"),
                    PlanConfig(num_gpus=world_size(tp, ep), tp=tp, ep=ep)).weights_bytes_per_gpu
    scalars = 4 * 4 * spec.num_layers if weights == "fp8" else 0
    padding = 0
    if weights == "fp8_block" and tp == 4:  # o: 256 columns, down: 256 columns -> 2 scale columns padded to 4
        padding = 4 * spec.num_layers * 2 * (spec.hidden_size // 128) * 2
    held = {weight_bytes(_meta_shard(spec, tp, ep, rank, weights)) for rank in range(world_size(tp, ep))}
    assert held == {plan + scalars + padding}


def test_block_scaled_slices_off_blocks_are_refused_before_any_rank_starts() -> None:
    """fp8_block at tp 4 of a 1024-wide FFN slices 256 columns: whole blocks; of a 640-wide one at tp 2, 320: refused,
    naming the matrix and the widths, in one line (as vLLM: "output_size of gate's and up's weight = 320 is not
    divisible by weight quantization block_n = 128"); per-tensor scales shard anywhere."""
    check_fp8_sharding(fp8_dense_spec(), 4, 1, "fp8_block")
    check_fp8_sharding(fp8_dense_spec().with_overrides(intermediate_size=640), 2, 1, "fp8")  # per-tensor: anywhere
    with pytest.raises(UsageError, match=r"^fp8_block: ffn.w_in would keep rows 0..320 \(320 wide\) of 1280") as err:
        check_fp8_sharding(fp8_dense_spec().with_overrides(intermediate_size=640), 2, 1, "fp8_block")
    assert "\n" not in str(err.value)
