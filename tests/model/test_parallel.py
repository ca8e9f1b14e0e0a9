"""The sharded decoder (``tfcalc.model.parallel``) on 2 and 4 CPU ranks (gloo): every rank's logits equal the
one-rank model's (fp32; tolerance 1e-5 of the largest logit, measured 2-4e-7: the sums only change order), prefill
and cached decode, for dense GQA with tp above the KV heads, soft caps and windows, qkv biases, sinks with expert
biases, MLA, MoE sliced by tp, placed by ep and dispatched by all-to-all; each rank holds exactly what
``tfcalc plan`` counts per GPU."""

from __future__ import annotations

import pytest
from shard_jobs import Case, CompareWithOneRank

from tfcalc.calc.plan import PlanConfig, plan_fit
from tfcalc.dtypes import WeightPrecision, get_dtype
from tfcalc.errors import UsageError
from tfcalc.model.parallel import check_sharding, world_size
from tfcalc.profile.distributed import launch
from tfcalc.spec.presets import load_gpu

TOLERANCE = 1e-5  # of the largest |logit|


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
    ]


def _four_rank_cases(small_spec) -> list[Case]:  # noqa: ANN001
    return [
        _case(small_spec, "deepseek-v3", 2, 4),  # ep > tp > 1: each tp rank dispatches its share of the tokens
        _case(small_spec, "deepseek-v3", 4, 2),  # ep < tp: 4 experts per rank, each sliced 2 ways
        _case(small_spec, "llama3-8b", 4, 1),
    ]


def _check(cases: list[Case], results: dict[str, list[dict]]) -> None:
    for case in cases:
        ranks = results[case.name]
        assert len(ranks) == world_size(case.tp, case.ep), case.name
        assert max(r["error"] for r in ranks) < TOLERANCE, (case.name, ranks)
        precision = WeightPrecision(get_dtype("fp32"))
        plan = plan_fit(case.spec, load_gpu("h100-sxm"), precision, get_dtype("fp32"),
                        PlanConfig(num_gpus=world_size(case.tp, case.ep), tp=case.tp, ep=case.ep))
        assert {r["params"] for r in ranks} == {plan.weights_bytes_per_gpu // 4}, case.name
        spec = case.spec
        per_forward = (2 * spec.num_layers + 2 if case.tp > 1 else 0) + (
            3 * spec.num_moe_layers if case.ep > case.tp else 0)
        assert {r["collectives"] for r in ranks} == {per_forward}, case.name


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
