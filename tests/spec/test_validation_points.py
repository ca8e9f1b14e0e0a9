"""benchmarks/validation/validate.py's reference points load from every source, and tfcalc's estimate stays near
aiconfigurator's kernel-table predictions at batches of 128-512 (docs/estimate-validation.md, sixteenth round)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def v(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("validation/validate.py")


def test_every_source_loads(v: ModuleType) -> None:
    kinds = {p["source_kind"] for p in v.load_points()}
    assert kinds == {"public", "silicon", "aiconfigurator", v.LARGE, *v.HOLDOUTS}


def test_held_out_points_keep_their_layout_and_agree_on_dense_models(v: ModuleType) -> None:
    """The held-out file (collected before the twenty-first round's changes) carries expert parallelism and the
    engines' own MoE formats; its dense points stay near aiconfigurator (they did from the first scoring), and its
    MoE points do not fall back below what the twenty-first round reached."""
    held = [p for p in v.load_points() if p["source_kind"] == v.HOLDOUT]
    assert len(held) >= 200 and {p["ep"] for p in held} >= {1, 8} and {p["gpu"] for p in held} >= {"b200", "h200"}
    dense: list[float] = []
    moe: list[float] = []
    for p in held:
        ttft, tpot = v.predict(p)
        (moe if v._model_name(p) in v.MOE else dense).extend([abs(ttft / p["ttft_ms"] - 1),
                                                                abs(tpot / p["tpot_ms"] - 1)])
    assert len(dense) >= 200 and sum(e <= 0.2 for e in dense) >= 0.95 * len(dense)
    # MoE: 228 of 276 when the busiest expert-parallel rank and SGLang's runner by architecture landed
    assert len(moe) >= 250 and sum(e <= 0.2 for e in moe) >= 0.8 * len(moe)


def test_large_batches_agree_with_aiconfigurator(v: ModuleType) -> None:
    large = [p for p in v.load_points() if p["source_kind"] == v.LARGE]
    assert len(large) >= 80 and min(p["batch"] for p in large) >= 128
    ttft_err, tpot_err = [], []
    for p in large:
        ttft, tpot = v.predict(p)
        assert math.isfinite(ttft) and math.isfinite(tpot) and ttft > 0 and tpot > 0
        ttft_err.append(abs(ttft / p["ttft_ms"] - 1))
        tpot_err.append(abs(tpot / p["tpot_ms"] - 1))
    # a step model that lost a term at large batch (the KV read, the GEMMs' M) would move whole engines at once
    assert statistics.median(ttft_err) < 0.15 and statistics.median(tpot_err) < 0.10
    assert sum(e <= 0.2 for e in tpot_err) >= 0.85 * len(large)


def test_caveats_name_loaded_points(v: ModuleType) -> None:
    """Every caveat in aiconfigurator_caveats.json tags a point that loads (none stale), with a known reason."""
    import json

    tagged = [p for p in v.load_points() if p.get("caveat")]
    assert len(tagged) == len(json.loads(v.CAVEATS.read_text())) >= 1
    assert {p["caveat"] for p in tagged} <= {"routing", "sliced", "unsplit", "interpolated", "older",
                                               "extrapolated", "dsa_extrapolated", "ssm_unmeasured", "untuned",
                                               "unreduced", "msa_disordered", "msa_extrapolated", "kda_conv",
                                               "min_latency", "double_reduce", "gdn_tp_table", "untuned_gemm"}
    assert all(p["source_kind"] != "silicon" for p in tagged)


def test_interpolation_shortfall_by_hand(benchmark_script: Callable[[str], ModuleType]) -> None:
    """Rows of 100 and 200 us at 16 and 32 tokens, 128 experts, top-8 (the power-law loads switch above 16 tokens):
    at 18 tokens w = 1/8, aiconfigurator's interpolation is 112.5 us and can be short by 7/8 x 100 / 112.5; none at a
    row, outside the rows, or where the switch is not between them (256 experts switch above 32 tokens)."""
    import pandas as pd

    c = benchmark_script("validation/aic_caveats.py")
    rows = pd.DataFrame({"moe_dtype": "bfloat16", "distribution": "power_law_1.2", "hidden_size": 2048,
                         "inter_size": 768, "num_experts": [128, 128, 256, 256], "topk": 8, "moe_tp_size": 1,
                         "moe_ep_size": 4, "num_tokens": [16, 32, 16, 32], "latency": [0.1, 0.2, 0.1, 0.2]})
    shape = (2048, 768, 128, 8)
    assert c.interpolation_shortfall(rows, "bfloat16", "power_law_1.2", shape, 1, 4, 18) == pytest.approx(
        7 / 8 * 100 / 112.5)
    assert c.interpolation_shortfall(rows, "bfloat16", "power_law_1.2", shape, 1, 4, 30) == pytest.approx(
        1 / 8 * 100 / 187.5)
    for tokens in (16, 12, 40):
        assert c.interpolation_shortfall(rows, "bfloat16", "power_law_1.2", shape, 1, 4, tokens) is None
    assert c.interpolation_shortfall(rows, "bfloat16", "power_law_1.2", (2048, 768, 256, 8), 1, 4, 18) is None
    assert c.interpolation_shortfall(rows, "bfloat16", "power_law_1.2", shape, 1, 8, 18) is None  # no such layout


def test_untuned_flashinfer_rows_by_hand(benchmark_script: Callable[[str], ModuleType], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM rows of 0.5 / 1.0 / 2.0 ms at 1 / 4 / 16 tokens from FlashInfer's CUTLASS MoE against TensorRT-LLM
    tables (its collector autotunes) of 0.125 / 0.25 / 0.4 ms: the median ratio over the shared token counts (4, 4,
    5), 4x, from the newest version holding the layout (an older table disagreeing is not read); None for a layout no
    TensorRT-LLM table holds. Rows of another kernel, or of mixed kernels, are not FlashInfer CUTLASS rows."""
    import pandas as pd

    c = benchmark_script("validation/aic_caveats.py")
    base = {"moe_dtype": "fp8", "distribution": "balanced", "hidden_size": 1024, "inter_size": 2688,
            "num_experts": 512, "topk": 22, "moe_tp_size": 2, "moe_ep_size": 1, "num_tokens": [1, 4, 16]}
    vllm = pd.DataFrame({**base, "latency": [0.5, 1.0, 2.0],
                         "kernel_source": "vllm_modeloptfp8moe_flashinfer_cutlass_flashinferexperts"})
    trtllm = {version: pd.DataFrame({**base, "latency": latency, "kernel_source": "moe_torch_flow_nongated"})
              for version, latency in (("1.3.0rc9", [0.5, 1.0, 2.0]), ("1.3.0rc23", [0.125, 0.25, 0.4]))}
    for version in trtllm:
        (tmp_path / "h200_sxm" / "moe" / "trtllm" / version).mkdir(parents=True)
    monkeypatch.setattr(c, "_tables", lambda root, system, engine, version: trtllm[version])
    shape = (1024, 2688, 512, 22)
    assert c.autotuned_ratio(tmp_path, "h200_sxm", "fp8", shape, 2, 1, vllm) == ("1.3.0rc23", pytest.approx(4.0))
    assert c.autotuned_ratio(tmp_path, "h200_sxm", "fp8", shape, 4, 1, vllm) is None
    assert c.flashinfer_cutlass_rows(vllm, "fp8", shape)
    assert not c.flashinfer_cutlass_rows(vllm, "bfloat16", shape)
    mixed = vllm.assign(kernel_source=["vllm_fp8moe_triton_tritonexperts", *vllm.kernel_source[1:]])
    assert not c.flashinfer_cutlass_rows(mixed, "fp8", shape)


def test_extrapolation_drop_by_hand(benchmark_script: Callable[[str], ModuleType]) -> None:
    """Rows of 3 ms at 12,288 tokens and 3 ms at 16,384: the last row's time per token is 3/4 of the row before it,
    a drop of 1/4, for any prefill beyond 16,384 tokens; none within the rows or for a layout the table lacks."""
    import pandas as pd

    c = benchmark_script("validation/aic_caveats.py")
    rows = pd.DataFrame({"moe_dtype": "bfloat16", "distribution": "power_law_1.2", "hidden_size": 2880,
                         "inter_size": 2880, "num_experts": 32, "topk": 4, "moe_tp_size": 1, "moe_ep_size": 4,
                         "num_tokens": [8192, 12288, 16384], "latency": [2.0, 3.0, 3.0]})
    shape = (2880, 2880, 32, 4)
    assert c.extrapolation_drop(rows, "bfloat16", "power_law_1.2", shape, 1, 4, 330_000) == pytest.approx(0.25)
    assert c.extrapolation_drop(rows, "bfloat16", "power_law_1.2", shape, 1, 4, 16_384) is None
    assert c.extrapolation_drop(rows, "bfloat16", "power_law_1.2", shape, 1, 8, 330_000) is None


def test_nearest_shared_ratio_by_hand(benchmark_script: Callable[[str], ModuleType]) -> None:
    """A layout (moe_tp 4, ep 1) borrowed from a donor table: compared on the nearest layout both hold with the same
    ep (moe_tp 2, not moe_tp 1 or ep 2), median of the donor's / own latencies over the shared token counts."""
    c = benchmark_script("validation/aic_caveats.py")
    own = {(1, 1): {1: 10.0, 2: 10.0}, (2, 1): {1: 4.0, 2: 5.0, 4: 8.0}, (1, 2): {1: 1.0}}
    donor = {(1, 1): {1: 10.0}, (2, 1): {1: 6.0, 2: 6.0, 4: 16.0}, (1, 2): {1: 9.0}, (4, 1): {1: 3.0}}
    assert c.nearest_shared_ratio(own, donor, 4, 1) == ((2, 1), pytest.approx(1.5))
    assert c.nearest_shared_ratio(own, {(8, 1): {1: 1.0}}, 4, 1) is None


def test_timed_rank_rows_follow_the_tied_groups(benchmark_script: Callable[[str], ModuleType]) -> None:
    """Worked by hand: the collector's balanced logits give each token one expert in every group of DeepSeek-V3's
    8, so every group ties, top-4 keeps groups 0-3, and the 4 rows those groups still owe go to the lowest-numbered
    tied experts (0-3): rank 0 holds 1 picked expert per group it owns plus every filler in its range. Plain top-k
    (one group) stays fair, k / ep."""
    c = benchmark_script("validation/aic_caveats.py")
    by_hand = {1: 8, 2: 8, 4: 6, 8: 5, 16: 4.5, 32: 4.25, 64: 4, 128: 2, 256: 1}
    for ep, rows in by_hand.items():
        assert c.timed_rank_rows(256, 8, 8, 4, ep) == pytest.approx(rows)
        assert c.timed_rank_rows(256, 8, 1, 1, ep) == pytest.approx(8 / ep)


def _held_out(v: ModuleType, kind: str, dense_share: float = 0.95, least: int = 90
              ) -> tuple[list[tuple[dict, list[float]]], list[float], list[float]]:
    """A held-out file's points with their |TTFT| and |TPOT| errors, and those errors pooled for its dense and MoE
    models (the points tagged with a reference caveat left out of the pools); ``dense_share`` of the dense values
    within 20 %; at least ``least`` points."""
    held = [p for p in v.load_points() if p["source_kind"] == kind]
    assert len(held) >= least and {p["gpu"] for p in held} == {"b200", "h200", "h100-sxm"}
    scored, dense, moe = [], [], []
    for p in held:
        ttft, tpot = v.predict(p)
        errors = [abs(ttft / p["ttft_ms"] - 1), abs(tpot / p["tpot_ms"] - 1)]
        scored.append((p, errors))
        if not p.get("caveat"):
            (moe if v._model_name(p) in v.MOE else dense).extend(errors)
    assert len(dense) >= 70 and sum(e <= 0.2 for e in dense) >= dense_share * len(dense)
    return scored, dense, moe


def _signed_errors(v: ModuleType, n: int, count: int) -> list[tuple[dict, float, float]]:
    """The n-th held-out file's ``count`` points with their TTFT and TPOT errors (tfcalc / reference - 1)."""
    held = [p for p in v.load_points() if p["source_kind"] == v.holdout(n)]
    assert len(held) == count
    return [(p, *(got / ref - 1 for got, ref in zip(v.predict(p), (p["ttft_ms"], p["tpot_ms"]), strict=True)))
            for p in held]


def test_third_held_out_grid(v: ModuleType) -> None:
    """The third held-out file (collected before the twenty-second round's changes): its dense points stay near
    aiconfigurator, and its MoE points without a reference caveat do not fall below their first scoring."""
    _, _, moe = _held_out(v, v.holdout(3))
    # first scoring: 102 of 114; vLLM's DeepSeek-V3 at tp 8 (6 values) since tagged "double_reduce"
    assert len(moe) >= 98 and sum(e <= 0.2 for e in moe) >= 0.85 * len(moe)


def test_fourth_held_out_grid(v: ModuleType) -> None:
    """The fourth held-out file (collected before the twenty-third round's changes): its dense points stay near
    aiconfigurator, its MoE points without a reference caveat do not fall below their first scoring (97 of 120 TTFT
    and TPOT values, three of them since tagged), and the SGLang expert-parallel Qwen3-30B-A3B points that shapes
    without a tuned Triton config explain stay within 20 %."""
    scored, _, moe = _held_out(v, v.holdout(4))
    untuned_ep = [errors for p, errors in scored if p["model"] == "qwen3-30b-a3b" and p["engine"] == "sglang"]
    assert len(untuned_ep) == 3 and all(errors[0] <= 0.2 for errors in untuned_ep)  # -22 ... -25 % at first
    # 12 values since tagged "interpolated", 6 (vLLM's DeepSeek-V3 at tp 8) "double_reduce"
    assert len(moe) >= 92 and sum(e <= 0.2 for e in moe) >= 87


def test_fifth_held_out_grid(v: ModuleType) -> None:
    """The fifth held-out file (collected before the twenty-fourth round's changes; first scoring TTFT 68 of 96,
    TPOT 92 of 96): its dense points stay near aiconfigurator, its MoE points without a reference caveat keep the
    round's gain (91 of 120 TTFT and TPOT values at the first scoring), and Mixtral 8x7B at ep 4 on vLLM and
    TensorRT-LLM, whose 5,000-token prefills the busiest rank of aiconfigurator's power-law draw sets (+24 ... +51 %
    under the normal approximation), stays within 20 %."""
    scored, _, moe = _held_out(v, v.holdout(5))
    mixtral_ep = [errors for p, errors in scored if p["model"] == "mixtral-8x7b" and p["engine"] in ("vllm", "trtllm")]
    assert len(mixtral_ep) == 6 and all(errors[0] <= 0.2 for errors in mixtral_ep)
    assert len(moe) >= 100 and sum(e <= 0.2 for e in moe) >= 95


def test_sixth_held_out_grid(v: ModuleType) -> None:
    """The sixth held-out file (collected before the twenty-fifth round's changes; first scoring TTFT 93 of 102,
    TPOT 95 of 102): its dense points stay near aiconfigurator, its MoE points without a reference caveat keep the
    round's gain (114 of 126 TTFT and TPOT values at the first scoring), and SGLang's gpt-oss-120b prefills on Hopper
    (one H100; ep 8 on H200), whose upcast experts' size slows the Triton kernel (-20 ... -24 % without
    kernels.moe_large_expert), stay within 20 %."""
    scored, _, moe = _held_out(v, v.holdout(6))
    upcast = [errors for p, errors in scored if p["model"] == "gpt-oss-120b" and p["engine"] == "sglang"]
    assert len(upcast) == 6 and all(errors[0] <= 0.2 for errors in upcast)
    assert len(moe) >= 116 and sum(e <= 0.2 for e in moe) >= 112  # 10 values since tagged "interpolated"


def test_seventh_held_out_grid(v: ModuleType) -> None:
    """The seventh held-out file (collected before stop 41's changes; first scoring TTFT 83 of 99, TPOT 88 of 99):
    its dense points stay near aiconfigurator, its MoE points without a reference caveat keep the round's gain (90
    of 102 TTFT and TPOT values at the first scoring, before 8 were tagged "interpolated"), and SGLang's gpt-oss-120b
    prefills at ep 8 on the B200, whose FlashInfer MXFP4 MoE computes only its own experts' rows (+21 ... +29 %
    priced as every row), stay within 20 %. Decode attention at the H100's measured kernel (latency.decode_attention)
    moves Mixtral-8x22B on vLLM at tp 8, batch 44 from -19.5 to -20.5 % (87)."""
    scored, _, moe = _held_out(v, v.holdout(7))
    fp4_ep = [errors for p, errors in scored if p["model"] == "gpt-oss-120b" and p["engine"] == "sglang"]
    assert len(fp4_ep) == 3 and all(errors[0] <= 0.2 for errors in fp4_ep)
    assert len(moe) >= 94 and sum(e <= 0.2 for e in moe) >= 87


def test_eighth_held_out_grid(v: ModuleType) -> None:
    """The eighth held-out file (collected before stop 42's changes; first scoring TTFT 103 of 117, TPOT 108 of 117;
    its MoE points without a reference caveat 94 of 100 values): its dense points stay near aiconfigurator, its MoE
    points keep the round's gain, and SGLang's Qwen3-30B-A3B prefills at ep 8 on the B200, whose FlashInfer TRT-LLM
    bf16 MoE computes only its own experts' rows (+8 ... +25 % priced as every row), stay within 20 %."""
    scored, _, moe = _held_out(v, v.holdout(8))
    own_rows = [errors for p, errors in scored if p["model"] == "qwen3-30b-a3b" and p["engine"] == "sglang"
                and p["gpu"] == "b200"]
    assert len(own_rows) == 3 and all(errors[0] <= 0.2 for errors in own_rows)
    assert len(moe) >= 100 and sum(e <= 0.2 for e in moe) >= 95


def _dense_tp8_above(v: ModuleType, kind: str) -> tuple[list[float], list[float]]:
    """A held-out file whose dense TTFT is all within 20 % (90 % of its dense values): its MoE |errors| without a
    caveat, and the signed TPOT errors of its dense points at tp 8 on the H100."""
    scored, _, moe = _held_out(v, kind, dense_share=0.9)
    dense = [(p, errors) for p, errors in scored if v._model_name(p) not in v.MOE]
    assert all(errors[0] <= 0.2 for _, errors in dense)
    return moe, [v.predict(p)[1] / p["tpot_ms"] - 1 for p, _ in dense if p["tp"] == 8 and p["gpu"] == "h100-sxm"]


def test_ninth_held_out_grid(v: ModuleType) -> None:
    """The ninth held-out file (collected before stop 43's changes; first scoring TTFT 108 of 132, TPOT 116 of 132):
    its dense TTFT stays near aiconfigurator, its dense TPOT at tp 8 on the H100 sits above it by the per-peer
    synchronisation its isolated all-reduce rows lack (+10 ... +27 %; aiconfigurator drifts -6 -> -24 % from tp 1 to
    8 against TensorRT-LLM's measured Llama 3.1 8B on the H100, tfcalc -7 -> +1 %: aic_silicon_drift.py), and its
    MoE points without a reference caveat keep their first scoring (120 of 126 values)."""
    moe, synced = _dense_tp8_above(v, v.holdout(9))
    assert len(synced) == 18 and all(0.0 < e <= 0.3 for e in synced)
    assert len(moe) >= 120 and sum(e <= 0.2 for e in moe) >= 118


def test_tenth_held_out_grid(v: ModuleType) -> None:
    """The tenth held-out file (collected before stop 44's changes; first scoring TTFT 124 of 141, TPOT 129 of 141,
    115 of 122 and 117 of 122 without reference caveats): its dense TTFT stays near aiconfigurator, its dense TPOT
    at tp 8 on the H100 (fp8 Qwen3-32B) above it by the per-peer synchronisation its all-reduce rows lack (+13 ...
    +23 %), and its MoE points without a reference caveat keep their first scoring (164 of 172 values)."""
    moe, synced = _dense_tp8_above(v, v.holdout(10))
    assert len(synced) == 9 and all(0.1 < e <= 0.3 for e in synced)
    assert len(moe) >= 166 and sum(e <= 0.2 for e in moe) >= 159  # 6 values since tagged "double_reduce"


def test_eleventh_held_out_grid(v: ModuleType) -> None:
    """The eleventh held-out file (collected before stop 45's changes; first scoring TTFT 102 of 117, TPOT 106 of
    117, 101 of 113 and 102 of 113 without reference caveats): its dense TTFT stays near aiconfigurator, its dense
    TPOT at tp 8 on the H100 (fp8 Llama 3.1 8B, Llama 3 70B) above it by the per-peer synchronisation (+7 ... +26 %),
    its MoE points without a reference caveat at least at their first scoring (139 of 154 values), and vLLM's
    Llama 3.1 8B on eight B200s at batch 46, whose 368 KiB all-reduces run vLLM's slow two-shot kernel there
    (kernels.custom_allreduce_two_shot; -22 % without it), within 20 %."""
    moe, synced = _dense_tp8_above(v, v.holdout(11))
    assert len(synced) == 18 and all(0.0 < e <= 0.3 for e in synced)
    assert len(moe) >= 148 and sum(e <= 0.2 for e in moe) >= 135  # 6 values since tagged "double_reduce"
    two_shot = [p for p in v.load_points() if p["source_kind"] == v.holdout(11) and p["engine"] == "vllm"
                and p["gpu"] == "b200" and p["model"] == "llama3.1-8b" and p["batch"] == 46]
    assert len(two_shot) == 1 and abs(v.predict(two_shot[0])[1] / two_shot[0]["tpot_ms"] - 1) <= 0.2


def test_twelfth_held_out_grid(v: ModuleType) -> None:
    """The twelfth held-out file (collected after stop 45's change to vLLM's all-reduce on the B200 and scored once:
    TTFT 100 of 117, TPOT 109 of 117; 108 before the change): its dense points stay near aiconfigurator (106 of 108
    values), its MoE values without a reference caveat at least at that scoring (93 of 108), and vLLM's B200 points
    whose decode all-reduces run its two-shot kernel (fp8 Llama 3 70B and Mixtral 8x7B at tp 8, Qwen3-32B at tp 4,
    batches 19-58; -31 % at worst without kernels.custom_allreduce_two_shot) within 20 % on TPOT."""
    _, _, moe = _held_out(v, v.holdout(12))
    assert len(moe) >= 100 and sum(e <= 0.2 for e in moe) >= 90  # 6 values (3 within) since "double_reduce"
    two_shot = [p for p in v.load_points() if p["source_kind"] == v.holdout(12) and p["engine"] == "vllm"
                and p["gpu"] == "b200" and v._model_name(p) in ("llama3-70b", "qwen3-32b", "mixtral-8x7b")]
    assert len(two_shot) == 9
    assert all(abs(v.predict(p)[1] / p["tpot_ms"] - 1) <= 0.2 for p in two_shot)


def test_thirteenth_held_out_grid(v: ModuleType) -> None:
    """The thirteenth held-out file: models no earlier grid holds (Qwen3-8B, Llama 3.1 405B in bf16 and fp8, block-fp8
    Qwen3-30B-A3B, Qwen3-Coder-480B-A35B and Kimi K2, the last read from its own config.json, a remote-code model
    type with DeepSeek-V3's architecture), scored once before stop 46's changes: TTFT 96 of 105, TPOT 102 of 105;
    every dense value within 20 % and 73 of the 82 MoE values without a reference caveat; Kimi K2's TPOT within
    20 % on all three engines."""
    scored, dense, moe = _held_out(v, v.holdout(13), dense_share=1.0)
    # Kimi K2 on vLLM (6 values, all within 20 %) since tagged "double_reduce"
    assert len(dense) >= 100 and len(moe) >= 76 and sum(e <= 0.2 for e in moe) >= 67
    models = {v._model_name(p) for p, _ in scored}
    assert {"qwen3-8b", "llama3.1-405b", "qwen3-coder-480b", "kimi-k2"} <= models
    kimi = [errors for p, errors in scored if v._model_name(p) == "kimi-k2"]
    assert len(kimi) == 9 and all(tpot <= 0.2 for _, tpot in kimi)


def test_fourteenth_held_out_grid(v: ModuleType) -> None:
    """The fourteenth held-out file, scored once (stop 46, no pricing change since the thirteenth): small models whose
    steps are mostly fixed costs (Qwen3-0.6B and 1.7B: one step of 17-49 sequences takes 1.7-3.6 ms), fp8 Qwen3-8B
    and Llama 3.1 405B on the H100: TTFT 68 of 69, TPOT 67 of 69 within 20 %; the small models' every value within
    20 %."""
    scored, dense, _ = _held_out(v, v.holdout(14), least=69)
    assert len(dense) >= 120 and sum(e <= 0.2 for e in dense) >= 125
    small = [errors for p, errors in scored if v._model_name(p) in ("qwen3-0.6b", "qwen3-1.7b")]
    assert len(small) == 45 and all(e <= 0.2 for errors in small for e in errors)


def test_fifteenth_held_out_grid_pipeline_parallel(v: ModuleType) -> None:
    """The fifteenth held-out file: pipeline parallelism (pp 2 and 4), which no grid held. aiconfigurator's static
    batch is one microbatch with pp of them in flight and its TTFT that microbatch's trip (validate.predict maps
    it so); like for like, TTFT 34 of 36 and TPOT 36 of 36 within 20 % (first scored with tfcalc's own reading, the
    batch split into pp microbatches and the last one's TTFT: 2 and 33 of 36)."""
    scored, dense, _ = _held_out(v, v.holdout(15), least=36)
    assert {p.get("pp", 1) for p, _ in scored} == {2, 4} and len(scored) == 36
    assert sum(ttft <= 0.2 for _, (ttft, _) in scored) >= 34 and all(tpot <= 0.2 for _, (_, tpot) in scored)


def test_sixteenth_held_out_grid_pipeline_parallel_moe(v: ModuleType) -> None:
    """The sixteenth held-out file, collected after the fifteenth's like-for-like reading of a pipeline and scored
    once with it: MoE models at pp 2 (Qwen3-30B-A3B, Mixtral 8x7B at tp 2, gpt-oss-120b, Qwen3-235B at tp 4 / ep 4):
    TTFT 22 of 24, TPOT 24 of 24 within 20 %."""
    held = [p for p in v.load_points() if p["source_kind"] == v.holdout(16)]
    assert len(held) == 24 and {p["pp"] for p in held} == {2}
    errors = [[abs(e) for e in (t / p["ttft_ms"] - 1, d / p["tpot_ms"] - 1)] for p in held for t, d in [v.predict(p)]]
    assert sum(ttft <= 0.2 for ttft, _ in errors) >= 22 and all(tpot <= 0.2 for _, tpot in errors)


def test_seventeenth_held_out_grid_nvfp4_and_tensorrt_llms_slower_stream(v: ModuleType) -> None:
    """The seventeenth held-out file, NVFP4 on the B200 (scored once: TTFT 36 / 40, TPOT 32 / 40, TensorRT-LLM's dense
    decode -23 ... -44 %). TensorRT-LLM's small-M NVFP4 GEMMs stream at 0.207 of HBM in its table against vLLM's
    0.341 (kernels.gemm_memory_efficiency, 0.76 x 0.207 / 0.341); with that its dense points' TPOT is 5 of 8
    within 20 % (0 before) and vLLM's and SGLang's stay within 11 %. Decode attention at the B200's measured kernel
    (latency.decode_attention; within 3 % of vLLM's fp8-cache table at Qwen3-32B's heads, batch 32-64, 4k tokens,
    where it was +11 ... +17 %) takes 1-9 points off every dense TPOT here: TensorRT-LLM 4 of 8, vLLM's and
    SGLang's within 16 % (the rest of the gap is outside attention)."""
    held = [p for p in v.load_points() if p["source_kind"] == v.holdout(17)]
    assert len(held) == 40
    errors = {(p["engine"], v._model_name(p), p["tp"], p["batch"]): v.predict(p)[1] / p["tpot_ms"] - 1 for p in held
              if v._model_name(p) not in v.MOE}
    trtllm = [e for (engine, *_), e in errors.items() if engine == "trtllm"]
    assert len(trtllm) == 8 and sum(abs(e) <= 0.2 for e in trtllm) >= 4 and sorted(trtllm)[3] > -0.21
    assert all(abs(e) <= 0.165 for (engine, *_), e in errors.items() if engine != "trtllm")


def test_eighteenth_held_out_grid_minimax_m2_and_nvfp4_expert_rows(v: ModuleType) -> None:
    """The eighteenth held-out file: MiniMax-M2.5, an architecture tfcalc first read in the same round (QK-norm across
    heads, partial RoPE, 256 sigmoid-routed experts), block fp8 on H100 / H200 / B200 and NVFP4 on the B200; 78
    points scored once: TTFT 65 / 78, TPOT 77 / 78, every block-fp8 TTFT within 16 %, the misses NVFP4 prefill (vLLM
    and SGLang +12 ... +32 %, TensorRT-LLM -16 ... -36 %). With NVFP4 experts staging FP4 rows between their GEMMs
    (kernels.moe_experts) and TensorRT-LLM's CUTLASS NVFP4 flow's own per-row traffic and grouped-GEMM efficiency
    (kernels.moe_row_bytes 16.3, moe_efficiency 1.48 on the B200; 1.21 since the fused kernels read each token's
    16-bit row once, stop 53): TTFT 77 / 78, every vLLM and SGLang point within
    20 %. TensorRT-LLM's six NVFP4 decodes at tp 1-2 rest on its opt-in min-latency MoE rows (caveat
    "min_latency"); TPOT 71 / 72 on the others since its CUTLASS MoE pays its cost per local expert."""
    scored = _signed_errors(v, 18, 78)
    assert {v._model_name(p) for p, _, _ in scored} == {"minimax-m2.5"}
    assert sum(abs(ttft) <= 0.2 for _, ttft, _ in scored) >= 77
    assert sum(p.get("caveat") == "min_latency" for p, _, _ in scored) == 6
    assert sum(abs(tpot) <= 0.2 for p, _, tpot in scored if p.get("caveat") != "min_latency") >= 71
    assert all(abs(ttft) <= 0.2 for p, ttft, _ in scored if p["engine"] != "trtllm" or p["weights"] == "fp8_block")
    assert all(abs(ttft) <= 0.26 for _, ttft, _ in scored)  # worst: TensorRT-LLM tp 2 at batch 4, -25.2 %


def test_nineteenth_held_out_grid_nvfp4_experts(v: ModuleType) -> None:
    """The nineteenth held-out file: NVFP4 experts on the B200 (Qwen3-30B-A3B, Qwen3-235B-A22B at ep 2-4, Mixtral
    8x7B, DeepSeek-V3 at ep 4-8, MiniMax-M2.5 at ep 4), collected after the eighteenth's FP4 staging and scored once:
    TTFT 49 / 63, TPOT 54 / 63, TensorRT-LLM's prefill -13 ... -36 %. That led to TensorRT-LLM's per-row traffic
    (kernels.moe_row_bytes, from the kernel tables' width-independent cost, not from these points): TTFT 53 / 63.
    Left: TensorRT-LLM's Mixtral (8 wide experts, whose CUTLASS GEMMs run slower than the fit; TTFT -31 ... -42 %,
    TPOT +41 ... +139 % against its min-latency kernel at the HBM roofline) and vLLM's DeepSeek-V3 at ep 4-8 (-29 ...
    -34 %, SGLang within 8 %). Since TensorRT-LLM's CUTLASS MoE pays its cost per local expert, its decodes that
    aiconfigurator prices from the opt-in min-latency rows (caveat "min_latency": Qwen3-30B-A3B and Mixtral at tp
    1-2) are no reference; every point without a caveat keeps its TPOT within 20 % (22)."""
    scored = _signed_errors(v, 19, 63)
    assert sum(abs(ttft) <= 0.2 for _, ttft, _ in scored) >= 53
    assert sum(p.get("caveat") == "min_latency" for p, _, _ in scored) == 9
    clean = [tpot for p, _, tpot in scored if not p.get("caveat")]
    assert len(clean) == 22 and all(abs(e) <= 0.2 for e in clean)
    assert all(abs(ttft) <= 0.2 for p, ttft, _ in scored if p["engine"] == "sglang")
    assert all(abs(ttft) <= 0.2 for p, ttft, _ in scored
               if p["engine"] == "trtllm" and v._model_name(p).startswith("qwen3"))


def test_twentieth_held_out_grid_qwen35_hybrid(v: ModuleType) -> None:
    """The twentieth held-out file: Qwen3.5 (27B dense, 35B-A3B in bf16 and block fp8, 397B-A17B at ep 8), the hybrid
    models tfcalc first read in stop 48 (Gated DeltaNet layers with a per-sequence state, gated attention), collected
    after that and scored once: TTFT 61 / 81, TPOT 76 / 81, SGLang's prefill -14 ... -38 %. That led to each
    engine's Gated DeltaNet prefill rate (kernels.gdn_efficiency and the gdn floors, read off the kernel tables,
    not these points) and to SGLang's FlashInfer TRT-LLM MoE for Qwen3.5-MoE on the B200 (its source): TTFT 73 / 81.
    Left: TensorRT-LLM's bf16 MoE at ep 8 on the H200 (its table 3-4x vLLM's: -62 ... -81 %)."""
    scored = _signed_errors(v, 20, 81)
    assert sum(abs(ttft) <= 0.2 for _, ttft, _ in scored) >= 73
    assert sum(abs(tpot) <= 0.2 for _, _, tpot in scored) >= 76
    assert all(abs(ttft) <= 0.2 and abs(tpot) <= 0.2 for p, ttft, tpot in scored if v._model_name(p) == "qwen3.5-27b")
    assert all(abs(ttft) <= 0.26 for p, ttft, _ in scored if not (p["engine"] == "trtllm" and p["gpu"] == "h200"
                                                                 and p.get("ep", 1) == 8))


def test_twenty_first_held_out_grid_qwen3_vl(v: ModuleType) -> None:
    """The twenty-first held-out file: Qwen3-VL (2B on a B200, 8B on H100s, 32B and 30B-A3B on H200s, 235B-A22B at
    ep 8), checkpoints tfcalc first read in stop 49, text-only requests, collected after that and scored once with
    no change in response: TTFT 72 / 72, TPOT 71 / 72; the one miss (SGLang's 235B at batch 24, +24 %) is a decode
    aiconfigurator interpolates across its power-law workload's switch (caveat "interpolated")."""
    scored, _, moe = _held_out(v, v.holdout(21), dense_share=1.0, least=72)
    assert len(scored) == 72 and all(ttft <= 0.2 for _, (ttft, _) in scored)
    assert all(e <= 0.2 for e in moe)  # both phases of every MoE point without a caveat
    assert sum(tpot <= 0.2 for _, (_, tpot) in scored) >= 71


def test_twenty_second_held_out_grid_gemma4(v: ModuleType) -> None:
    """The twenty-second held-out file: Gemma 4 (26B-A4B at tp 1-2 and ep 2, 31B at tp 2-4; vLLM and SGLang on H100 /
    H200, the three engines on a B200), checkpoints tfcalc first read in stop 50. Scored once before any change:
    TTFT 42 / 60, TPOT 58 / 60, SGLang's 21 Hopper prefills 4-48 % fast. Its collector times Gemma 4's attention on
    Triton there (heads over FlashAttention's 256), whose windowed rows grow with the square of the prompt: with
    that kernel's measured rate (sglang preset, kernels.wide_head_prefill_attention, read from the kernel table, not
    from this grid) TTFT 57 / 60; the three misses are vLLM's 31B at tp 4 (+20 ... +23 %)."""
    scored = _signed_errors(v, 22, 60)
    assert sum(abs(ttft) <= 0.2 for _, ttft, _ in scored) >= 57
    assert sum(abs(tpot) <= 0.2 for _, _, tpot in scored) >= 58
    hopper_sglang = [ttft for p, ttft, _ in scored if p["engine"] == "sglang" and p["gpu"] != "b200"]
    assert len(hopper_sglang) == 21 and all(abs(e) <= 0.2 for e in hopper_sglang)
    assert all(abs(ttft) <= 0.25 for _, ttft, _ in scored)


def test_twenty_third_held_out_grid_dsa(v: ModuleType) -> None:
    """The twenty-third held-out file: DeepSeek Sparse Attention (DeepSeek-V3.2 at tp 8 and ep 8, GLM-5 at tp 8; H200s
    and B200s; the three engines), checkpoints tfcalc first read in stop 51. Scored once before any change: TTFT
    23 / 63, TPOT 28 / 63 (the block's fixed costs missing: TensorRT-LLM's decode 26-54 % fast). With the engines'
    DSA block floors and sparse-prefill rates read from aiconfigurator's module tables (dsa_kernel_rates.py, not
    from this grid): TPOT 59 / 63, TTFT 47 / 63 (TensorRT-LLM 21 / 21); the misses in TTFT are SGLang's prefills
    priced far beyond its table (caveat "dsa_extrapolated") and vLLM's batched B200 prefills (its table's rows of
    64K+ tokens take half the time per token of the rows below)."""
    scored = _signed_errors(v, 23, 63)
    assert sum(abs(tpot) <= 0.2 for _, _, tpot in scored) >= 59
    assert sum(abs(ttft) <= 0.2 for _, ttft, _ in scored) >= 47
    assert all(abs(ttft) <= 0.2 for p, ttft, _ in scored if p["engine"] == "trtllm")
    hopper = [(p, ttft) for p, ttft, _ in scored if p["gpu"] == "h200" and not p.get("caveat")]
    assert len(hopper) >= 30 and sum(abs(e) <= 0.2 for _, e in hopper) >= 0.8 * len(hopper)
    assert all(abs(tpot) <= 0.35 for _, _, tpot in scored)


def test_twenty_fourth_held_out_grid_nemotron_h(v: ModuleType) -> None:
    """The twenty-fourth held-out file: Nemotron-H (Nemotron 3 Nano 30B-A3B on H100s at tp 1-2, H200s at tp 2 / ep 2
    and a B200; Nemotron-H 56B on H100s at tp 2-4, H200s at tp 2, a B200; the three engines), checkpoints tfcalc first
    read in stop 51. Scored once before any change: TTFT 62 / 90, TPOT 49 / 90. aiconfigurator's Mamba-2 tables hold
    only the causal-conv kernels: its decode prices the SSM state update at about nothing, so where the states are a
    fifth of the step's bytes (the 56B at batch 24-64; caveat "ssm_unmeasured") tfcalc's TPOT is 38-98 % above it.
    SGLang serves Nano's relu^2 MoE on FlashInfer CUTLASS on Hopper, 3-7x vLLM's Triton time in aiconfigurator's
    tables: its 15 Hopper points were most of tfcalc's other misses (-40 ... -78 %). With Mamba-2's scan counted per
    B/C group (a FLOP count corrected after the scoring) and a block's norm counted once: TTFT 64 / 90, TPOT 50 / 90;
    with that kernel's own rates on Hopper (SGLang's architecture entry, stop 52: it runs at FlashInfer's heuristic
    tactics, SGLang tuning none of them) 79 / 90 and 65 / 90, SGLang's TTFT 29 / 30 and its TPOT off only on the
    ssm_unmeasured points (Nano's 15 within 16 % in both)."""
    scored = _signed_errors(v, 24, 64 + 26)
    assert sum(abs(ttft) <= 0.2 for _, ttft, _ in scored) >= 79
    assert sum(abs(tpot) <= 0.2 for _, _, tpot in scored) >= 65
    unmeasured = [tpot for p, _, tpot in scored if p.get("caveat") == "ssm_unmeasured"]
    assert len(unmeasured) >= 20 and all(tpot > 0.2 for tpot in unmeasured)
    vllm_trt = [(ttft, tpot) for p, ttft, tpot in scored if p["engine"] != "sglang" and not p.get("caveat")]
    assert sum(abs(a) <= 0.2 and abs(b) <= 0.2 for a, b in vllm_trt) >= 0.7 * len(vllm_trt)
    sglang_hopper = [(ttft, tpot) for p, ttft, tpot in scored if p["engine"] == "sglang" and p["gpu"] != "b200"
                     and "nemotron-3-nano" in p["model"]]
    assert len(sglang_hopper) == 15 and all(abs(ttft) <= 0.2 and abs(tpot) <= 0.2 for ttft, tpot in sglang_hopper)


def test_twenty_fifth_held_out_grid_nemotron_super(v: ModuleType) -> None:
    """The twenty-fifth held-out file: Nemotron 3 Super 120B-A12B in FP8 (a latent MoE: 512 experts on a 1,024-wide
    projection), vLLM only (aiconfigurator 0.12 has no SGLang or TensorRT-LLM MoE rows for its shape: 18 error points
    left out). Scored once before any change: TTFT 0 / 9, TPOT 2 / 9. On Hopper vLLM serves ModelOpt FP8 experts with
    FlashInfer's CUTLASS MoE, which a vLLM server autotunes at start-up and aiconfigurator's collector times untuned
    (4.2-5.2x TensorRT-LLM's autotuned rows of the shape): those six points carry the caveat "untuned", and tfcalc,
    priced as the tuned kernel (the GPU's fp8 rates, which TensorRT-LLM's autotuned per-tensor fp8 rows bear out),
    stays well below them in both phases. On the B200 vLLM runs them on FlashInfer's TRT-LLM MoE, which passes fp8
    rows with the activation fused (kernels.moe_fused_rows; its rates fitted on the gated models' rows, Nemotron's
    plain experts held apart): its prefills went from +60 ... +66 % to within 12 %, its TPOT within 25 %."""
    scored = _signed_errors(v, 25, 9)
    hopper = [(p, ttft, tpot) for p, ttft, tpot in scored if p["gpu"] != "b200"]
    assert len(hopper) == 6 and all(p.get("caveat") == "untuned" for p, _, _ in hopper)
    assert all(ttft < -0.3 and tpot < -0.6 for _, ttft, tpot in hopper)
    b200 = [(ttft, tpot) for p, ttft, tpot in scored if p["gpu"] == "b200"]
    assert len(b200) == 3 and all(abs(ttft) <= 0.12 and abs(tpot) <= 0.25 for ttft, tpot in b200)


def test_thirty_fifth_held_out_grid_models_from_fixtures(v: ModuleType) -> None:
    """The thirty-fifth held-out file: Kimi K3 (no preset: read from its config.json fixture, aiconfigurator's own
    copy), MiniMax-M3 and Llama-3.3-Nemotron-Super-49B (presets), on the engines aiconfigurator 0.12 has their kernels
    for (KDA: vLLM and SGLang; MSA: SGLang 0.5.16 and TensorRT-LLM 1.3.0rc23, no SGLang NVFP4 rows). A name no preset
    has resolves to the fixture; a preset's name stays the preset even where a fixture of that name exists. Scored
    once with no change: its dense model (NAS blocks of varying attention and FFN widths) within 20 %. Kimi K3 since
    (its experts on Marlin on vLLM, with MXFP8 inputs on SGLang): vLLM within 31 % (TTFT, -56 ... -66 % before) and
    21 % (TPOT), SGLang's TPOT no longer above aiconfigurator (+50 % before) nor 30 % below it."""
    assert v.model_file("kimi-k3") == "tests/fixtures/hf_configs/kimi-k3.json"
    assert v.model_file("llama3.1-8b") == "llama3.1-8b" and (v.FIXTURES / "llama3.1-8b.json").exists()
    scored = _signed_errors(v, 35, 53)
    engines = {(v._model_name(p), p["engine"]) for p, _, _ in scored}
    assert {e for m, e in engines if m == "kimi-k3"} == {"vllm", "sglang"}
    assert {e for m, e in engines if m == "minimax-m3"} == {"vllm", "sglang", "trtllm"}
    dense = [(ttft, tpot) for p, ttft, tpot in scored if v._model_name(p) not in v.MOE]
    assert len(dense) == 21 and all(abs(ttft) <= 0.2 and abs(tpot) <= 0.2 for ttft, tpot in dense)
    k3 = [(p["engine"], ttft, tpot) for p, ttft, tpot in scored if v._model_name(p) == "kimi-k3"]
    # vLLM's TPOT at batch 1: -21.3 % once the B300's own FlashInfer MLA block (67 us) prices its attention
    assert all(abs(ttft) <= 0.31 and abs(tpot) <= 0.22 for engine, ttft, tpot in k3 if engine == "vllm")
    assert all(-0.3 <= tpot <= 0 for engine, _, tpot in k3 if engine == "sglang")


def test_thirty_sixth_held_out_grid_new_presets_and_the_a100(v: ModuleType,
                                                            benchmark_script: Callable[[str], ModuleType]) -> None:
    """The thirty-sixth held-out file: presets no earlier grid holds (four of them handed to aiconfigurator as tfcalc's
    config.json fixtures) and the A100 (aiconfigurator's a100_sxm, 80 GiB: the a100-80gb preset), every point on all
    three engines. Scored once with no change: its dense points within 20 % on both phases."""
    collect = benchmark_script("validation/aiconfigurator_points.py")
    assert all((v.FIXTURES / name).exists() for name in collect.FIXTURE_CONFIGS.values())
    assert v.AIC_GPU["a100_sxm"] == "a100-80gb"
    scored = _signed_errors(v, 36, 60)
    models = {v._model_name(p) for p, _, _ in scored}
    assert all({p["engine"] for p, _, _ in scored if v._model_name(p) == m} == {"vllm", "sglang", "trtllm"}
               for m in models)
    assert {p["gpu"] for p, _, _ in scored} == {"h100-sxm", "h200", "b300", "a100-80gb"}
    dense = [(ttft, tpot) for p, ttft, tpot in scored if v._model_name(p) not in v.MOE]
    assert len(dense) == 42 and all(abs(ttft) <= 0.2 and abs(tpot) <= 0.2 for ttft, tpot in dense)


def test_thirty_fifth_held_out_grid_minimax_m3_on_tensorrt_llm(v: ModuleType) -> None:
    """MiniMax-M3 on TensorRT-LLM (grid 35): on the H200 its Triton MSA path (per-query FP32 copies of every key,
    kernels.msa_fp32_expansion) and on the B200 its fmha_sm100 decode block's fixed cost put every TPOT within 20 %
    (first scored -45 ... -70 %) and the H200 prefills within 20 % where aiconfigurator's rows reach; the B200's
    prefill rows are no function of the work ("msa_disordered") and the H200's 64-prompt prefill lies beyond the
    rows ("msa_extrapolated")."""
    scored = [(p, ttft, tpot) for p, ttft, tpot in _signed_errors(v, 35, 53)
              if v._model_name(p) == "minimax-m3" and p["engine"] == "trtllm"]
    assert len(scored) == 7 and all(abs(tpot) <= 0.2 for _, _, tpot in scored)
    clean = [ttft for p, ttft, _ in scored if not p.get("caveat")]
    assert len(clean) == 3 and all(abs(ttft) <= 0.2 for ttft in clean)
    assert sorted(p.get("caveat", "") for p, _, _ in scored) == ["", "", "", "msa_disordered", "msa_disordered",
                                                                  "msa_disordered", "msa_extrapolated"]


def test_thirty_first_held_out_grid_trtllm_kimi_k25_nvfp4_decode(v: ModuleType) -> None:
    """Kimi K2.5's 384 NVFP4 experts on TensorRT-LLM (grid 31): its CUTLASS MoE, the kernel it runs at every batch
    (no min-latency rows above 256 experts), with its cost per local expert puts every TPOT within 23 % (first
    -19 ... -33 %, all below), with both signs now present; and the B300's NVFP4 MoE points of grid 27 (no
    min-latency rows on SM103) within 22 % (first 9 of 15 within 20 %, worst -29 %)."""
    scored = _signed_errors(v, 31, 33)
    # aiconfigurator keeps the checkpoint's attention in bf16 (its self_attn layers are not quantized)
    assert {p["weights"] for p, _, _ in scored} == {"default=nvfp4,attention=bf16"}
    # its vLLM points price four all-reduces per layer
    assert {p.get("caveat") for p, _, _ in scored if p["engine"] == "vllm"} == {"double_reduce"}
    kimi = [(p, tpot) for p, _, tpot in scored if p["engine"] == "trtllm"]
    assert len(kimi) == 11 and all(abs(e) <= 0.23 for _, e in kimi)
    assert min(e for _, e in kimi) < 0 < max(e for _, e in kimi)
    b300 = [tpot for p, _, tpot in _signed_errors(v, 27, 84) if p["engine"] == "trtllm" and p["weights"] == "nvfp4"
            and v._model_name(p) in v.MOE]
    assert len(b300) == 15 and all(abs(e) <= 0.22 for e in b300)


def test_min_latency_ratio_by_hand(benchmark_script: Callable[[str], ModuleType]) -> None:
    """aic_caveats.min_latency_ratio: where the table holds TensorRT-LLM's min-latency NVFP4 rows of the shape and
    layout, the median over <= 128 tokens of their latency over the CUTLASS rows' (20/60, 30/60, 40/80 -> 0.5); rows
    beyond 128 tokens do not enter; None for a decode of more than 128 tokens, another layout, or no such rows."""
    import pandas as pd

    c = benchmark_script("validation/aic_caveats.py")
    shape = {"moe_dtype": "nvfp4", "distribution": "power_law_1.01", "hidden_size": 7168, "inter_size": 2048,
             "num_experts": 256, "topk": 8, "moe_tp_size": 8, "moe_ep_size": 1}
    rows = [{**shape, "kernel_source": source, "num_tokens": t, "latency": ms}
            for source, by_tokens in (("moe_torch_flow_min_latency", {1: 0.02, 16: 0.03, 64: 0.04, 256: 0.5}),
                                      ("moe_torch_flow_cutlass", {1: 0.06, 16: 0.06, 64: 0.08, 256: 0.1}))
            for t, ms in by_tokens.items()]
    df = pd.DataFrame(rows)
    assert c.min_latency_ratio(df, (7168, 2048, 256, 8), "power_law_1.01", 8, 1, 24) == pytest.approx(0.5)
    assert c.min_latency_ratio(df, (7168, 2048, 256, 8), "power_law_1.01", 8, 1, 129) is None
    assert c.min_latency_ratio(df, (7168, 2048, 256, 8), "power_law_1.01", 4, 1, 24) is None
    cutlass_only = df[df.kernel_source == "moe_torch_flow_cutlass"]
    assert c.min_latency_ratio(cutlass_only, (7168, 2048, 256, 8), "power_law_1.01", 8, 1, 24) is None


def test_fallback_excess_by_hand(benchmark_script: Callable[[str], ModuleType]) -> None:
    """aic_caveats.fallback_excess: a 10,240-wide projection priced 22 us, with a 6 us floor and 70 us at 65,536 wide
    of the same K, is expected at 6 + 70 x 10,240 / 65,536 = 16.9375 us: 5.0625 over; a price under the
    expectation counts 0."""
    c = benchmark_script("validation/aic_caveats.py")
    assert c.fallback_excess(22.0, 6.0, 70.0, 10240) == pytest.approx(22.0 - 6.0 - 70.0 * 10240 / 65536)
    assert c.fallback_excess(10.0, 6.0, 70.0, 10240) == 0.0


def test_msa_caveat_rules_by_hand(benchmark_script: Callable[[str], ModuleType]) -> None:
    """aic_caveats.msa_disorder: the largest ratio of a row to one of at least as much work (sequences and prompt
    both); msa_beyond: sequences past the rows at the shortest prompt length of at least the point's, with the growth
    of the time per sequence from one to the most; None where a row holds them."""
    import pandas as pd

    c = benchmark_script("validation/aic_caveats.py")
    rows = pd.DataFrame({"batch_size": [1, 2, 1, 2], "isl": [1024, 1024, 2048, 2048],
                         "latency": [1.0, 2.2, 4.0, 3.0]})
    ratio, slow, fast = c.msa_disorder(rows)
    assert ratio == pytest.approx(4.0 / 3.0) and slow == (1, 2048, 4.0) and fast == (2, 2048, 3.0)
    assert c.msa_beyond(rows, 4, 1500) == (2048, 2, pytest.approx(3.0 / 2 / 4.0 - 1))
    assert c.msa_beyond(rows, 2, 1000) is None and c.msa_beyond(rows, 4, 4096) is None
    assert c.msa_beyond(rows, 4, 1000) == (1024, 2, pytest.approx(0.1))

def test_thirty_seventh_held_out_grid_llama_family_and_pcie_cards(
        v: ModuleType, benchmark_script: Callable[[str], ModuleType]) -> None:
    """The thirty-seventh held-out file: the LLAMA-family presets grid 36 left (handed to aiconfigurator as tfcalc's
    config.json fixtures) on six GPUs, the L40S and RTX PRO 6000 Server among them (aiconfigurator's l40s and
    rtx_pro_6000_server tables), every point on all three engines. Scored once with no change: on the NVLink GPUs
    every point within 30 % on both phases (worst 26 %) and 24 of the 27 dense ones within 20 %; the L40S's misses
    are read in docs/estimate-validation.md, not asserted. The RTX PRO 6000's rows changed after that first scoring
    (TTFT 2/12, TPOT 8/12 within 20 % on the L40S's borrowed rates): on the card's own measured rates, fitted on
    aiconfigurator's rtx_pro_6000_server kernel tables and not on these points, every TPOT within 20 % and 11 of 12
    TTFTs (the twelfth, SGLang's Qwen3-30B-A3B, +33 %)."""
    collect = benchmark_script("validation/aiconfigurator_points.py")
    assert all((v.FIXTURES / name).exists() for name in collect.FIXTURE_CONFIGS.values())
    assert (v.AIC_GPU["l40s"], v.AIC_GPU["rtx_pro_6000_server"]) == ("l40s", "rtx-pro-6000")
    scored = _signed_errors(v, 37, 63)
    models = {v._model_name(p) for p, _, _ in scored}
    assert {"qwen2.5-7b", "qwen2.5-14b", "qwen2.5-72b", "llama3.2-1b", "llama3-8b"} <= models
    assert all({p["engine"] for p, _, _ in scored if v._model_name(p) == m} == {"vllm", "sglang", "trtllm"}
               for m in models)
    assert {p["gpu"] for p, _, _ in scored} == {"l40s", "rtx-pro-6000", "a100-80gb", "gb200", "gb300", "b300"}
    nvlink = [(p, ttft, tpot) for p, ttft, tpot in scored if p["gpu"] not in ("l40s", "rtx-pro-6000")]
    assert len(nvlink) == 33 and all(abs(ttft) <= 0.3 and abs(tpot) <= 0.3 for _, ttft, tpot in nvlink)
    dense = [(ttft, tpot) for p, ttft, tpot in nvlink if v._model_name(p) not in v.MOE]
    assert len(dense) == 27 and sum(abs(ttft) <= 0.2 and abs(tpot) <= 0.2 for ttft, tpot in dense) >= 24
    card = [(ttft, tpot) for p, ttft, tpot in scored if p["gpu"] == "rtx-pro-6000"]
    assert len(card) == 12 and all(abs(tpot) < 0.2 and abs(ttft) < 0.35 for ttft, tpot in card)
    assert sum(abs(ttft) < 0.2 for ttft, _ in card) >= 11


def test_thirty_seventh_grid_mixtral_on_four_l40s_prices_the_pcie_ring_by_gpu_count(v: ModuleType) -> None:
    """Mixtral 8x7B at tp 4 on the L40S (grid 37, rescored after pcie4's nccl_efficiency_by_gpus, which was read
    from aiconfigurator's NCCL table, not from these points): TTFT -58 ... -69 % with the 2-GPU ring's 20 GB/s,
    now within 30 % on every engine, TensorRT-LLM (whose aiconfigurator path is NCCL's) within 10 %."""
    scored = [(p, ttft, tpot) for p, ttft, tpot in _signed_errors(v, 37, 63)
              if p["gpu"] == "l40s" and v._model_name(p) == "mixtral-8x7b"]
    assert len(scored) == 3 and all(abs(ttft) <= 0.3 and abs(tpot) <= 0.1 for _, ttft, tpot in scored)
    assert all(abs(ttft) <= 0.1 for p, ttft, _ in scored if p["engine"] == "trtllm")


def test_vllm_b200_mixtral_prefill_with_large_experts(v: ModuleType) -> None:
    """vLLM's B200 bf16 Mixtral points of every held-out grid (tp 1-8, ep 1-4): with the large-expert slowdown
    (kernels.moe_large_expert) their TTFT stays within 25 % of aiconfigurator whatever the expert's size (-50 % at tp
    1, -22 % at tp 4 for 8x22B without it), and neither sign dominates at tp <= 2 by more than 20 %."""
    points = [p for p in v.load_points() if p["source_kind"] in v.HOLDOUTS and p["engine"] == "vllm"
              and p["gpu"] == "b200" and p["model"].startswith("mixtral")]
    assert len(points) >= 21
    errors = {}
    for p in points:
        errors[(p["model"], p["tp"], p.get("ep", 1), p["batch"])] = v.predict(p)[0] / p["ttft_ms"] - 1
    assert all(abs(e) <= 0.25 for e in errors.values()), errors
    assert all(abs(e) <= 0.2 for (_, tp, _, _), e in errors.items() if tp <= 2)


def _layout_rows(shape: dict, column: str, latency: dict[int, dict[int, float]]) -> list[dict]:
    """Kernel-table rows of one shape: ``latency[layout][tokens]`` in ms, the layout in ``column``."""
    return [{**shape, column: layout, "num_tokens": tokens, "latency": ms}
            for layout, by_tokens in latency.items() for tokens, ms in by_tokens.items()]


def test_unsplit_ratio_is_the_median_ep2_over_ep1(benchmark_script: Callable[[str], ModuleType]) -> None:
    """aic_caveats.unsplit_ratio: balanced latency at moe_ep 2 over moe_ep 1, moe_tp 1, same tokens, median over
    4,096+ tokens; power-law rows, other dtypes and moe_tp do not enter; a missing layout gives None."""
    import pandas as pd

    c = benchmark_script("validation/aic_caveats.py")
    shape = {"moe_dtype": "bfloat16", "distribution": "balanced", "hidden_size": 4096, "inter_size": 14336,
             "num_experts": 8, "topk": 2, "moe_tp_size": 1}
    rows = _layout_rows(shape, "moe_ep_size", {1: {1024: 1.0, 4096: 4.0, 8192: 8.0, 16384: 16.0},
                                               2: {1024: 5.0, 4096: 3.6, 8192: 8.0, 16384: 17.6}})
    rows += [{**shape, "moe_ep_size": 2, "num_tokens": 8192, "latency": 0.1, "distribution": "power_law_1.2"},
             {**shape, "moe_ep_size": 2, "num_tokens": 8192, "latency": 0.1, "moe_dtype": "fp8_block"},
             {**shape, "moe_ep_size": 2, "num_tokens": 8192, "latency": 0.1, "moe_tp_size": 2}]
    df = pd.DataFrame(rows)
    assert c.unsplit_ratio(df, "bfloat16", (4096, 14336, 8, 2)) == pytest.approx(1.0)  # 0.9, 1.0, 1.1
    assert c.unsplit_ratio(df, "bfloat16", (4096, 14336, 8, 1)) is None
    assert c.unsplit_ratio(None, "bfloat16", (4096, 14336, 8, 2)) is None


def test_sliced_excess_is_the_median_ratio_to_half_the_slicing(benchmark_script: Callable[[str], ModuleType]) -> None:
    """aic_caveats.sliced_excess: latency at moe_tp over latency at moe_tp / 2, same tokens, median over 64+ tokens;
    other shapes, dtypes, distributions and ep do not enter; a missing layout gives None."""
    import pandas as pd

    c = benchmark_script("validation/aic_caveats.py")
    shape = {"moe_dtype": "bfloat16", "distribution": "power_law_1.2", "hidden_size": 6144, "inter_size": 16384,
             "num_experts": 8, "topk": 2, "moe_ep_size": 1}
    rows = _layout_rows(shape, "moe_tp_size", {4: {16: 1.0, 64: 1.0, 1024: 2.0, 4096: 4.0},
                                               8: {16: 9.0, 64: 2.0, 1024: 5.0, 4096: 12.0}})
    rows.append({**shape, "moe_tp_size": 8, "num_tokens": 1024, "latency": 0.1, "moe_dtype": "fp8_block"})
    rows.append({**shape, "moe_tp_size": 8, "num_tokens": 1024, "latency": 0.1, "moe_ep_size": 2})
    df = pd.DataFrame(rows)
    key = ("bfloat16", "power_law_1.2", (6144, 16384, 8, 2))
    assert c.sliced_excess(df, *key, 8, 1) == pytest.approx(2.5)  # ratios 2, 2.5, 3 (16 tokens left out)
    assert c.sliced_excess(df, *key, 4, 1) is None  # no moe_tp 2 rows
    assert c.sliced_excess(df, *key, 1, 1) is None and c.sliced_excess(None, *key, 8, 1) is None


def test_public_end_to_end_points(v: ModuleType) -> None:
    """Each published static batch timed end to end names its page and conversion, and is compared with one prefill
    plus gen - 1 decode steps (vLLM's benchmark_latency, TensorRT-LLM's gptSessionBenchmark)."""
    e2e = [p for p in v.load_points() if p["source_kind"] == "public" and p.get("e2e_ms")]
    assert len(e2e) >= 13 and all(p["url"].startswith("https://") and p["note"] and p["reference"] for p in e2e)
    for p in e2e:
        ttft, tpot, total = v.predict_all(p)
        assert total == pytest.approx(ttft + (p["gen"] - 1) * tpot, rel=1e-9)
        assert (ttft, tpot) == v.predict(p)


def test_public_2025_points_state_their_setting(v: ModuleType) -> None:
    """The 2025-2026 published points (those naming an ``engine_version``) each carry their page, the quoted figure
    and its conversion, one measured metric, batch 1-4 at tp 1-16, and a model tfcalc loads: a TPOT derived from a
    published tok/s or fit stays the decode step of one sequence (milliseconds, not seconds or tok/s)."""
    new = [p for p in v.load_points() if p["source_kind"] == "public" and p.get("engine_version")]
    assert len(new) >= 15
    for p in new:
        assert p["url"].startswith("https://") and p["note"] and p["reference"]
        assert sum(bool(p.get(k)) for k in ("ttft_ms", "tpot_ms", "e2e_ms")) == 1
        assert 1 <= p["batch"] <= 4 and 1 <= p["tp"] <= 16 and p["prompt"] >= 1 and p["gen"] >= 2
        assert v.load_spec(p["model"]).num_layers > 0
        if p.get("tpot_ms"):
            assert 1.0 < p["tpot_ms"] < 50.0


def test_gpt_oss_vllm_triton_kernels_regression(v: ModuleType) -> None:
    """vLLM PR #43135's H100 gpt-oss-20b steps (tp 1, concurrency 1, 1024 / 1024): tfcalc, whose vLLM kernels are
    measured on 0.24, is within 20 % of the builds without the triton_kernels 3.6.0 routing regression (v0.16.0, the
    fix), and tfcalc plus the regression's published cost (regressed build less the fix: 1.09 ms a step) is within
    20 % of the regressed build and of the vLLM 0.19.1 blog's H100 points (docs/estimate-validation.md)."""
    points = v.load_points()
    pr = [p for p in points if p.get("url") == "https://github.com/vllm-project/vllm/pull/43135"]
    regressed = [p for p in pr if p["engine_version"].startswith("main before")]
    fixed = [p for p in pr if p not in regressed]
    assert len(regressed) == 1 and len(fixed) == 2
    cost = regressed[0]["tpot_ms"] - min(p["tpot_ms"] for p in fixed)
    assert cost == pytest.approx(1.09, abs=0.02)
    for p in fixed:
        assert abs(v.predict(p)[1] / p["tpot_ms"] - 1) <= 0.2
    blog = [p for p in points if p.get("url") == "https://vllm.ai/blog/2026-04-22-fp8-kvcache"
            and p["model"] == "gpt-oss-20b" and p["gpu"] == "h100-sxm"]
    assert len(blog) == 4
    for p in [*regressed, *blog]:
        assert abs((v.predict(p)[1] + cost) / p["tpot_ms"] - 1) <= 0.2



def test_vllm_points_priced_by_their_release(v: ModuleType) -> None:
    """A vLLM point naming a release is priced with the preset whose releases cover it (0.19.1 -> vllm-0.17, 0.10.2
    -> vllm-0.8, aiconfigurator's 0.24.0 tables -> vllm-0.24); a build named otherwise, and other engines, with the
    engine's default."""
    point = {"engine": "vllm", "engine_version": "0.19.1"}
    assert v.engine_preset(point) == "vllm-0.17"
    assert v.engine_preset({**point, "engine_version": "0.10.2"}) == "vllm-0.8"
    assert v.engine_preset({**point, "engine_version": "0.24.0"}) == "vllm-0.24"
    assert v.engine_preset({**point, "engine_version": "0.21"}) == "vllm-0.21"
    assert v.engine_preset({**point, "engine_version": "main + #43135 (merged 2026-05-19)"}) == "vllm"
    assert v.engine_preset({**point, "engine_version": ""}) == "vllm"
    assert v.engine_preset({"engine": "sglang", "engine_version": "0.5.1"}) == "sglang"
    aic = [p for p in v.load_points() if p["source_kind"] == "aiconfigurator" and p["engine"] == "vllm"]
    assert aic and {v.engine_preset(p) for p in aic} <= {"vllm-0.24", "vllm-0.11"}
