"""``tfcalc estimate`` end to end: columns, efficiencies, calibration file, explain, plot, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcalc.cli import app

runner = CliRunner()
COLUMNS = ["model", "gpu", "tp", "batch", "prompt_len", "gen_len", "prefill_flops", "ttft_s", "ttft_s_ideal",
           "decode_bytes_per_step", "tpot_s", "tpot_s_ideal", "decode_tokens_per_s", "decode_tokens_per_s_ideal",
           "prefill_bound", "decode_bound"]
ARGS = ["estimate", "--preset", "llama3-8b", "--gpu", "h100-sxm", "--batch", "1", "--prompt-len", "1k",
        "--gen-len", "256"]


def test_issue_example() -> None:
    result = runner.invoke(app, [*ARGS, "-f", "json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert list(row)[:len(COLUMNS)] == COLUMNS
    assert row["decode_bound"] == "memory" and row["prefill_bound"] == "compute"
    assert 215 < row["decode_tokens_per_s_ideal"] < 225


def test_efficiency_sweep_and_explain() -> None:
    result = runner.invoke(app, [*ARGS, "--bandwidth-efficiency", "0.5,1", "--explain", "--tp", "1,2", "-f", "json"])
    assert result.exit_code == 0, result.output
    words = " ".join(result.stderr.split())  # --explain goes to stderr beside JSON, wrapped at 80 columns
    assert "E x" not in words  # dense model: no expert formula
    assert "all-reduce" in words and "decode: bytes per GPU per step = weights" in words
    rows = json.loads(result.stdout)  # stdout is the JSON alone
    assert len(rows) == 4  # 2 tp x 2 bandwidth efficiencies
    slow, fast = (r for r in rows if r["tp"] == 1)
    assert slow["tpot_s"] > fast["tpot_s"] and slow["tpot_s_ideal"] == fast["tpot_s_ideal"]


def test_calibration_file(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"device_name": "NVIDIA H100", "compute_efficiency": {"prefill": 0.5, "decode": 0.5},
                                "bandwidth_efficiency": {"prefill": 0.5, "decode": 0.5}, "source": "test"}))
    result = runner.invoke(app, [*ARGS, "--calibration", str(path), "-f", "json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)[0]
    default = json.loads(runner.invoke(app, [*ARGS, "-f", "json"]).stdout)[0]
    # The calibrated efficiencies (0.5) replace the H100 preset's (0.80 GEMM, 0.86 HBM): every kernel slows down,
    # but fixed per-kernel floors do not scale, so decode is less than 2x the pure roofline (the old single-factor
    # model made it exactly 2x: that ignored floors and per-shape efficiency).
    assert row["tpot_s"] > default["tpot_s"] and row["tpot_s"] > 1.5 * row["tpot_s_ideal"]
    assert row["memory_efficiency"] == 0.5 and "cal.json" in row["efficiency_source"]
    path.write_text(json.dumps({"compute_efficiency": {"prefill": 0.5}}))
    result = runner.invoke(app, [*ARGS, "--calibration", str(path)])
    assert result.exit_code == 1 and "compute_efficiency.decode" in result.stderr
    path.write_text("{not json")
    result = runner.invoke(app, [*ARGS, "--calibration", str(path)])
    assert result.exit_code == 1 and "malformed JSON" in result.stderr


def test_moe_explain_shows_expected_experts() -> None:
    result = runner.invoke(app, ["estimate", "-p", "mixtral-8x7b", "--batch", "64", "--explain", "--tp", "2"])
    assert result.exit_code == 0, result.output
    assert "E x (1 - (1 - k/E)^B) = 8 x (1 - (1 - 2/8)^64)" in " ".join(result.stdout.split())


def test_explain_says_gemma4s_global_layers_and_sglangs_fallback_prefill() -> None:
    """Gemma 4's global layers priced with their own shape; SGLang on an H100 runs its heads of 512 on the Triton
    fallback (said with its rate), vLLM on flash attention (no such line)."""
    def explain(engine: str) -> str:
        result = runner.invoke(app, ["estimate", "-p", "gemma4-31b", "--gpu", "h100-sxm", "--engine", engine, "--tp",
                                     "2", "--batch", "4", "--prompt-len", "3000", "--explain"])
        assert result.exit_code == 0, result.output
        return " ".join(result.stdout.split())

    sglang, vllm = explain("sglang"), explain("vllm")
    assert "global layers: 10 of 60 with heads of 512 over 4 KV heads (the others 256 over 16)" in sglang
    assert "fallback (Triton) kernel, 5.25 x the flash time of the whole causal triangle" in sglang
    assert "global layers: 10 of 60" in vllm and "fallback (Triton)" not in vllm


def test_explain_says_whether_the_fused_moe_shape_has_a_tuned_config() -> None:
    """SGLang 0.5.14 ships a bf16 Triton config for Mixtral 8x7B's experts at tp 2 on an H200 (8 x 7168), none for
    the 4 local experts of ep 2 (4 x 14336): the explain line says which, and the default tiles' rate."""
    base = ["estimate", "-p", "mixtral-8x7b", "-g", "h200", "-e", "sglang", "--tp", "2", "--explain"]
    tuned = runner.invoke(app, base)
    untuned = runner.invoke(app, [*base, "--ep", "2"])
    assert tuned.exit_code == 0 and untuned.exit_code == 0, tuned.output + untuned.output
    assert "ships a tuned kernel config for 8 x 7168 (bf16" in " ".join(tuned.stdout.split())
    text = " ".join(untuned.stdout.split())
    assert "ships no tuned kernel config for 4 x 14336 (bf16" in text and "0.47 of a dense GEMM, K0 32" in text
    other = runner.invoke(app, ["estimate", "-p", "mixtral-8x7b", "-g", "h200", "-e", "trtllm", "--explain"])
    assert other.exit_code == 0 and "tuned kernel config" not in other.stdout


def test_explain_says_whether_an_expert_is_past_the_engines_large_expert_size() -> None:
    """vLLM's B200 bf16 experts slow down past 44 MiB of gate/up matrix per GPU: Mixtral 8x7B at tp 1 holds 224
    MiB (1 + 1.75 x (1 - 44/224) = 2.41x), at tp 8 28 MiB (no slowdown); TensorRT-LLM has no such entry. SGLang's
    MXFP4 experts on an H100, upcast to bf16, count at 16 bits: gpt-oss-120b's 32 MiB, 1 + 1.10 (1 - 6/31.6)."""
    base = ["estimate", "-p", "mixtral-8x7b", "-g", "b200", "--explain"]
    whole, sliced = runner.invoke(app, base), runner.invoke(app, [*base, "--tp", "8"])
    assert whole.exit_code == 0 and sliced.exit_code == 0, whole.output + sliced.output
    text = " ".join(whole.stdout.split())
    assert "gate/up matrix holds 224 MiB per GPU (bf16)" in text and "take 2.41x as long" in text
    assert "holds 28 MiB per GPU (bf16); the engine's kernel on b200 slows down past 44 MiB: not here" in " ".join(
        sliced.stdout.split())
    other = runner.invoke(app, [*base, "-e", "trtllm"])
    assert other.exit_code == 0 and "gate/up matrix" not in other.stdout
    upcast = runner.invoke(app, ["estimate", "-p", "gpt-oss-120b", "-g", "h100-sxm", "-e", "sglang", "--explain"])
    assert upcast.exit_code == 0, upcast.output
    assert ("holds 32 MiB per GPU (mxfp4, held at 16 bits); the engine's kernel on h100-sxm slows down past 6 MiB: its "
            "grouped GEMMs take 1.89x as long") in " ".join(upcast.stdout.split())


def test_explain_names_flashinfer_moe_stream_and_fused_rows() -> None:
    """SGLang serves Nemotron-H's experts on an H200 with FlashInfer's CUTLASS MoE, untuned: the explain line gives
    its one weight stream (0.15 of the datasheet); vLLM there has no such line. vLLM's ModelOpt FP8 experts on a
    B200 pass 8-bit rows between the GEMMs; its bf16 experts there do not."""
    base = ["estimate", "-p", "nemotron-3-nano-30b-a3b", "-b", "8", "--explain"]
    sglang = runner.invoke(app, [*base, "-g", "h200", "-e", "sglang"])
    vllm = runner.invoke(app, [*base, "-g", "h200", "-e", "vllm"])
    fp8 = runner.invoke(app, [*base, "-g", "b200", "-e", "vllm", "-w", "fp8_e4m3"])
    bf16 = runner.invoke(app, [*base, "-g", "b200", "-e", "vllm"])
    for result in (sglang, vllm, fp8, bf16):
        assert result.exit_code == 0, result.output
    text = " ".join(sglang.stdout.split())
    assert ("the engine's kernel for NemotronHForCausalLM on h200 streams its experts' weights at 0.15 of the "
            "datasheet bandwidth whatever the tokens (bf16; its tactics untuned)") in text
    assert "whatever the tokens" not in " ".join(vllm.stdout.split())
    assert "fp8_e4m3 kernel on b200 passes 8-bit rows between its GEMMs" in " ".join(fp8.stdout.split())
    assert "8-bit rows" not in " ".join(bf16.stdout.split())


def test_explain_names_a_formats_own_moe_floor() -> None:
    """TensorRT-LLM's MXFP4 experts on an H200 pay their backend's fixed cost, not the engine's moe floor, and the
    rates line says which."""
    result = runner.invoke(app, ["estimate", "-p", "gpt-oss-120b", "-g", "h200", "-e", "trtllm", "--explain"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "moe 29.4 µs" in text and "moe (mxfp4 experts) 56.4 µs" in text
    assert "under ep" not in text


def test_explain_names_vllms_own_two_shot_all_reduce_on_a_b200() -> None:
    """vLLM at tp 8 on a B200 says where its own two-shot kernel runs (below 1 MiB) and what it costs; on an H100,
    at tp 1 and under SGLang there is no such line."""
    def explain(*extra: str) -> str:
        result = runner.invoke(app, ["estimate", "-p", "llama3-70b", "--no-fit", "--explain", *extra])
        assert result.exit_code == 0, result.output
        return " ".join(result.stdout.split())

    assert "own two-shot kernel on nvlink5 below 1 MiB at tp 8 (1.8 µs + 2.2 µs per peer)" in explain(
        "-g", "b200", "--tp", "8")
    for extra in (["-g", "h100-sxm", "--tp", "8"], ["-g", "b200", "--tp", "1"], ["-g", "b200", "--tp", "8", "-e",
                                                                                "sglang"]):
        assert "own two-shot" not in explain(*extra)


def test_explain_names_what_the_moe_adds_under_expert_parallelism() -> None:
    """vLLM's MXFP4 experts on an H200 pay 26.9 us more at ep 4 (their expert-map routing path); the rates line
    says so only where ep > 1."""
    args = ["estimate", "-p", "gpt-oss-120b", "-g", "h200", "-e", "vllm", "--tp", "4", "--explain"]
    plain = " ".join(runner.invoke(app, args).stdout.split())
    result = runner.invoke(app, [*args, "--ep", "4"])
    assert result.exit_code == 0, result.output
    assert "moe (mxfp4 experts) under ep +26.9 µs" in " ".join(result.stdout.split()) and "under ep" not in plain


def test_errors() -> None:
    result = runner.invoke(app, [*ARGS, "--compute-efficiency", "1.2"])
    assert result.exit_code == 2 and "compute efficiency" in result.stderr
    result = runner.invoke(app, ["estimate", "-p", "llama3-8b", "--tp", "3"])
    assert result.exit_code == 2 and "attention heads" in result.stderr


def test_plot_png(tmp_path: Path) -> None:
    path = tmp_path / "roofline.png"
    result = runner.invoke(app, [*ARGS, "--batch", "1,64", "--plot", str(path)])
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _json(*args: str) -> list[dict]:
    result = runner.invoke(app, ["estimate", *args, "-f", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_every_parallelism_has_its_cost() -> None:
    rows = _json("-p", "deepseek-v3", "-g", "h200", "--tp", "8", "--batch", "16")
    assert rows[0]["decode_tp_comm_s"] > 0 and rows[0]["decode_ep_comm_s"] == 0 and rows[0]["num_gpus"] == 8
    (ep,) = _json("-p", "deepseek-v3", "-g", "h200", "--tp", "1", "--ep", "8", "--batch", "16")
    assert (ep["dp"], ep["num_gpus"], ep["decode_tp_comm_s"]) == (8, 8, 0) and ep["decode_ep_comm_s"] > 0
    (pp,) = _json("-p", "llama3-70b", "--tp", "4", "--pp", "2", "--batch", "8")
    assert pp["num_gpus"] == 8 and pp["pipeline_microbatches"] == 2 and pp["decode_pp_s"] >= 0
    assert pp["prefill_pp_s"] > 0  # the pipeline fills and drains


def test_groups_add_up_and_explain_names_them() -> None:
    result = runner.invoke(app, ["estimate", "-p", "qwen3-30b-a3b", "-g", "h200", "--batch", "4", "--explain"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert all(len(line) <= 80 for line in result.stdout.split("\n# ", 1)[1].splitlines())
    for words in ("op group", "attention", "MoE", "embedding + lm_head", "floors (in the above)",
                  "E x (1 - (1 - k/E)^B) = 128 x (1 - (1 - 8/128)^4)", "tp 1: no all-reduce"):
        assert words in text
    (row,) = _json("-p", "qwen3-30b-a3b", "-g", "h200", "--batch", "4")
    groups = sum(row[f"decode_{g}_s"] for g in ("attention", "dense_ffn", "moe", "lm_head", "communication"))
    assert groups == pytest.approx(row["tpot_s"])
    assert row["decode_dense_ffn_s"] == 0 and row["decode_moe_s"] > row["decode_attention_s"]


def test_ideal_mode_is_the_pure_roofline() -> None:
    (ideal,) = _json(*ARGS[1:], "--ideal")
    (default,) = _json(*ARGS[1:])
    assert ideal["tpot_s"] == ideal["tpot_s_ideal"] == default["tpot_s_ideal"] < default["tpot_s"]
    assert ideal["ttft_s"] == ideal["ttft_s_ideal"] and ideal["decode_limited_by"] == "pure roofline"


def test_rows_that_do_not_fit_say_so() -> None:
    result = runner.invoke(app, ["estimate", "-p", "llama3-70b", "--batch", "1,64", "--prompt-len", "8k"])
    assert result.exit_code == 0, result.output
    assert "does not fit -- the weights alone leave no room for the KV cache" in " ".join(result.stdout.split())
    rows = _json("-p", "llama3-70b", "--tp", "4", "--batch", "1,256", "--prompt-len", "32k")
    assert [r["fits"] for r in rows] == [True, False]
    assert rows[1]["max_concurrent_sequences"] < 256
    (unchecked,) = _json("-p", "llama3-70b", "--no-fit")
    assert unchecked["fits"] is None


def test_engines_and_fabrics(tmp_path: Path) -> None:
    nccl = tmp_path / "nccl-only.yaml"
    nccl.write_text("display_name: an engine without custom all-reduce\nbudget: ideal\n"
                    "kernels: {custom_allreduce: false}\nsources: {kernels: a test}\n")
    rows = {e: _json("-p", "llama3-70b", "--tp", "8", "--engine", e)[0] for e in ("vllm", str(nccl))}
    assert rows[str(nccl)]["decode_tp_comm_s"] > rows["vllm"]["decode_tp_comm_s"]  # NCCL rings for small messages
    assert rows[str(nccl)]["engine"] == "nccl-only"
    (pcie,) = _json("-p", "llama3-70b", "--tp", "8", "--interconnect", "pcie5")
    assert pcie["decode_tp_comm_s"] > rows["vllm"]["decode_tp_comm_s"]
    trt, vllm = (_json("-p", "deepseek-v3", "-g", "h200", "--tp", "8", "--engine", e)[0] for e in ("trtllm", "vllm"))
    assert trt["decode_attention_s"] < vllm["decode_attention_s"]  # the engines' measured MLA block floors
    (eager,) = _json("-p", "llama3.2-1b", "--no-cuda-graphs")
    (graphs,) = _json("-p", "llama3.2-1b")
    assert eager["tpot_s"] > graphs["tpot_s"]  # ~150 kernels a step wait for the host
    (skewed,) = _json("-p", "qwen3-30b-a3b", "--batch", "16", "--routing-skew", "1.2")
    (uniform,) = _json("-p", "qwen3-30b-a3b", "--batch", "16")
    assert skewed["decode_weight_bytes_per_step"] < uniform["decode_weight_bytes_per_step"]
    (zipf,) = _json("-p", "qwen3-30b-a3b", "--batch", "16", "--routing", "zipf:1.2")
    assert zipf["tpot_s"] == skewed["tpot_s"]
    (power,) = _json("-p", "qwen3-30b-a3b", "--batch", "16", "--routing", "power-law:1.2")
    assert power["decode_weight_bytes_per_step"] < 0.75 * uniform["decode_weight_bytes_per_step"]
    assert power["tpot_s"] < uniform["tpot_s"]


@pytest.mark.parametrize(("args", "message"), [
    (["--engine", "tgi"], "unknown engine 'tgi'"),
    (["--interconnect", "nvlink9"], "unknown interconnect preset 'nvlink9'"),
    (["--allreduce", "star"], "invalid --allreduce 'star'"),
    (["--compute-dtype", "fp6"], "unknown compute dtype 'fp6'"),
    (["--routing-skew", "-1"], "invalid routing skew"),
    (["--routing", "lognormal:1"], "invalid routing 'lognormal:1'"),
    (["--routing", "power-law:9"], "invalid power-law routing exponent '9'"),
    (["--routing", "zipf:1", "--routing-skew", "1"], "give either --routing or --routing-skew"),
    (["--routing-skew", "1", "--routing", "uniform"], "give either --routing or --routing-skew"),  # was: skew kept
    (["--ideal", "--compute-efficiency", "0.5"], "--ideal reports 100 % of the peaks: drop --compute-efficiency"),
    (["--ideal", "--bandwidth-efficiency", "0.5"], "--ideal reports 100 % of the peaks"),  # was: silently ignored
    (["--engine", "vllm@"], "name a version after the @"),
    (["--no-fit", "--gpu-memory-utilization", "0.5"], "--gpu-memory-utilization sizes the fit check: drop --no-fit"),
    (["--batch", ""], "invalid batch '': empty"),
    (["--pp", "64"], "pp 64 exceeds the 32 layers"),
    (["--tp", "3"], "tp 3 does not divide the 32 attention heads"),
    (["--ep", "2"], "ep 2 given but llama3-8b has no experts"),
    (["--redundant-experts", "8"], "--redundant-experts needs an MoE model: llama3-8b has no experts"),
    (["--compute-efficiency", "1e-200"], "invalid compute efficiency '1e-200': must be greater than 0.001"),
    (["--bandwidth-efficiency", "5e-324"], "invalid bandwidth efficiency"),
    (["--prompt-len", str(1 << 54)], "at most 1,099,511,627,776"),  # lengths stay exact in the float arithmetic
])
def test_usage_errors(args: list[str], message: str) -> None:
    result = runner.invoke(app, [*ARGS, *args])
    assert result.exit_code != 0 and message in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_output_never_replaces_the_calibration(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    text = json.dumps({"device_name": "NVIDIA H100", "compute_efficiency": {"prefill": 0.5, "decode": 0.5},
                       "bandwidth_efficiency": {"prefill": 0.5, "decode": 0.5}, "source": "test"})
    path.write_text(text)
    result = runner.invoke(app, [*ARGS, "--calibration", str(path), "-o", str(path)])
    assert result.exit_code == 2 and "refusing to overwrite an input" in result.stderr
    assert path.read_text() == text


def test_calibration_v2_errors_name_the_row(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"kind": "tfcalc-calibration", "version": 2,
                                "gemm": [{"dtype": "bf16", "m": 1, "n": 1024, "k": 1024}]}))
    result = runner.invoke(app, [*ARGS, "--calibration", str(path)])
    assert result.exit_code == 1 and "gemm[0]: missing field 'seconds'" in result.stderr
    path.write_text(json.dumps({"kind": "tfcalc-calibration", "memory": [{"bytes": 1 << 20, "seconds": 1e-4},
                                                                         {"bytes": 1 << 30, "seconds": 0.1}]}))
    (row,) = _json(*ARGS[1:], "--calibration", str(path))
    assert row["memory_efficiency"] == pytest.approx((1 << 30) / (0.1 - 1e-4) / 3.35e12, rel=1e-6)


def test_profile_rows_still_calibrate(tmp_path: Path) -> None:
    rows = [{"status": "ok", "device_name": "NVIDIA H100 80GB HBM3", "mfu_datasheet": 0.5, "mbu_datasheet": 0.6}]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(rows))
    (row,) = _json(*ARGS[1:], "--calibration", str(path))
    assert row["memory_efficiency"] == 0.6 and row["gemm_efficiency"] == 0.5


def test_estimate_and_plan_read_engines_alike(tmp_path: Path) -> None:
    """One --engine for both commands: the same names, and estimate's fits is plan's verdict for the same flags."""
    from tfcalc.spec.presets import load_engine

    plan_args = ["plan", "-p", "qwen2.5-72b", "--tp", "2", "--max-model-len", "8192", "--batch", "3", "-f", "json"]
    est_args = ["-p", "qwen2.5-72b", "--tp", "2", "--prompt-len", "8064", "--gen-len", "128", "--batch", "3"]
    for engine in ("vllm", "vllm@0.19", "vllm-0.8", "sglang", "trtllm", "gpt-fast", "ideal"):
        planned = runner.invoke(app, [*plan_args, "--engine", engine])
        assert planned.exit_code in (0, 1), planned.output
        (plan_row,) = json.loads(planned.stdout)
        (row,) = _json(*est_args, "--engine", engine)
        assert row["engine"] == plan_row["engine"]
        assert (row["fits"], row["kv_budget_bytes_per_gpu"]) == (plan_row["fits"], plan_row["kv_budget_bytes_per_gpu"])
        expected = None if engine == "ideal" else load_engine(engine).kernels
        assert expected is None or row["engine"] == load_engine(engine).label
    # the verdicts differ between engine versions (vLLM 0.21 subtracts CUDA graphs), and plan's flags count too
    (tight,) = _json(*est_args, "--engine", "vllm", "--gpu-memory-utilization", "0.8")
    (loose,) = _json(*est_args, "--engine", "vllm", "--gpu-memory-utilization", "0.95")
    assert tight["kv_budget_bytes_per_gpu"] < loose["kv_budget_bytes_per_gpu"]
    (planned,) = json.loads(runner.invoke(app, [*plan_args, "--gpu-memory-utilization", "0.95"]).stdout)
    assert planned["kv_budget_bytes_per_gpu"] == loose["kv_budget_bytes_per_gpu"]


def test_engine_from_the_environment_and_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFCALC_ENGINE", "vllm@0.19")
    (row,) = _json(*ARGS[1:])
    assert row["engine"] == "vllm 0.17-0.19"
    rows = _json(*ARGS[1:], "--engine", "sglang,trtllm")
    assert [r["engine"] for r in rows] == ["sglang 0.5.10+", "trtllm 1.0+"]
    result = runner.invoke(app, [*ARGS, "--engine", "sglang,trtllm"])
    assert result.exit_code == 0 and "engine" in result.stdout.splitlines()[1]  # a column when engines compare


def test_bad_moe_efficiency_in_a_user_gpu_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "mygpu.yaml"
    path.write_text("memory_gb: 96\nhbm_bandwidth_gb_s: 4000\ndense_tflops: {bf16: 500}\n"
                    "interconnect_bidirectional_gb_s: 900\nlatency: {sm_count: 100, gemm_efficiency: {bf16: 0.7}, "
                    "attention_efficiency: 0.5, moe_efficiency: {bf16: 0.7, fp9: 0.6}, memory_efficiency: 0.8, "
                    "floors_us: {gemm: 3, elementwise: 2, attention: 9, moe: 20}, interconnect_preset: pcie5}\n")
    result = runner.invoke(app, ["estimate", "-p", "mixtral-8x7b", "-g", str(path)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "unknown dtype 'latency.moe_efficiency.fp9'" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_fp8_scales_option() -> None:
    """--fp8-scales: vLLM's online fp8 of a 16-bit preset is dynamic by default (the explanation says so), static
    is faster; a bad value is a one-line error and a non-zero exit."""
    args = ["estimate", "-p", "llama3-70b", "-g", "h100-sxm", "--tp", "8", "-w", "fp8", "-f", "json"]
    auto, static = (runner.invoke(app, [*args, *extra]) for extra in ([], ["--fp8-scales", "static"]))
    assert auto.exit_code == static.exit_code == 0, auto.output
    assert json.loads(auto.stdout)[0]["tpot_s"] > json.loads(static.stdout)[0]["tpot_s"]
    explained = runner.invoke(app, [*args, "--explain"])
    assert "scale their inputs dynamically" in " ".join(explained.stderr.split())
    bad = runner.invoke(app, [*args, "--fp8-scales", "sometimes"])
    assert bad.exit_code != 0 and "unknown fp8 input scaling 'sometimes'" in bad.output
    assert "Traceback" not in bad.output


def test_explain_says_where_shared_experts_run_beside_the_routed_ones() -> None:
    """--explain names the engine's rule for the shared experts' second stream and whether the decode step here
    follows it: vLLM at batch 16 (<= 256 tokens) yes, at 300 no; SGLang's preset has no such stream."""
    args = ["estimate", "-p", "deepseek-v3", "-g", "h200", "--tp", "8", "-w", "fp8_block", "--explain"]
    texts = {}
    for engine, batch in (("vllm", "16"), ("vllm", "300"), ("sglang", "16")):
        result = runner.invoke(app, [*args, "-e", engine, "-b", batch])
        assert result.exit_code == 0, result.output
        texts[engine, batch] = " ".join(result.output.split())
    assert "second CUDA stream beside the router and routed experts in steps of <= 256 tokens (decode here: yes)" \
        in texts["vllm", "16"]
    assert "(decode here: no)" in texts["vllm", "300"]
    assert "second CUDA stream" not in texts["sglang", "16"]


def test_redundant_experts_open_ep_72() -> None:
    """ep 72 of DeepSeek-V3's 256 experts is refused in one line that names the way out; with --redundant-experts 32
    (288 slots) it runs, the rows say so, and the expert-parallel GPUs hold 4 experts each, as at ep 64."""
    base = ["estimate", "-p", "deepseek-v3", "-g", "gb200", "-e", "sglang", "--tp", "1", "-b", "9216", "--prompt-len",
            "2000", "--gen-len", "2", "-w", "fp8_block", "--kv-dtype", "fp8", "-f", "json"]
    refused = runner.invoke(app, [*base, "--ep", "72"])
    assert refused.exit_code != 0
    assert refused.output.strip().splitlines()[-1].startswith("error: ep 72 does not divide the 256 experts")
    rows = json.loads(runner.invoke(app, [*base, "--ep", "72", "--redundant-experts", "32"]).stdout)
    assert rows[0]["redundant_experts"] == 32 and rows[0]["ep"] == 72 and rows[0]["dp"] == 72
    plain = json.loads(runner.invoke(app, [*base[:10], "8192", *base[11:], "--ep", "64"]).stdout)[0]
    assert rows[0]["weights_bytes_per_gpu"] == plain["weights_bytes_per_gpu"]
    assert "redundant_experts" not in plain
    explain = " ".join(runner.invoke(app, [*base[:-2], "--ep", "72", "--redundant-experts", "32", "--explain"]
                                     ).stdout.split())
    assert "= 288 (256 + 32 redundant) x (1 - (1 - 8/288)^9216)" in explain and "each GPU holds 4 experts" in explain
    assert "(HGX B200) across 72 GPUs" in explain   # the NVL72's NVLink domain


def test_values_narrower_than_keys_are_named_in_the_explanation() -> None:
    """MiMo-V2-Flash: the explanation names its global layers' shape and its values' width beside the keys'."""
    config = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs" / "mimo-v2-flash.json"
    result = runner.invoke(app, ["estimate", "-c", str(config), "--gpu", "h200", "--tp", "4", "--batch", "8",
                                 "--prompt-len", "4k", "--gen-len", "500", "--explain"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "global layers: 9 of 48 with heads of 192 over 4 KV heads (the others 192 over 8)" in text
    assert "values: heads of 128 beside keys of 192 (v_head_dim), cached and multiplied at their own width" in text


def test_model_runner_reaches_the_fit_check() -> None:
    """--model-runner sets the runner of vLLM 0.22-0.31 for the fit check, and refuses one the release lacks."""
    base = ["estimate", "-p", "qwen3-30b-a3b", "--engine", "vllm@0.25", "--batch", "8", "--prompt-len", "1024",
            "--gen-len", "128", "--format", "json"]
    ok = CliRunner().invoke(app, [*base, "--model-runner", "V2"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)[0]["fits"] is True
    bad = CliRunner().invoke(app, [*base, "--model-runner", "V7"])
    assert bad.exit_code != 0 and "must be V1 or V2 for vllm 0.25" in bad.output


def test_a_length_past_the_models_context_is_noted() -> None:
    """As kv-cache notes it: llama3-8b's 8,192 tokens (its card) are past by 8k + 256, not by 1k + 256."""
    result = runner.invoke(app, [*ARGS, "--prompt-len", "1k,8k"])
    assert result.exit_code == 0, result.output
    assert "note: llama3-8b: prompt + gen 8,448 exceeds its max context of 8,192 tokens" in result.stdout
    assert "1,280 exceeds" not in result.stdout


def test_sentences_about_one_row_name_the_swept_format_they_belong_to() -> None:
    # a weights sweep gives each format its own turning point and fit; a sentence that does not say which format
    # it is about reads as three contradictory verdicts on the same model, GPU and tp
    args = ["estimate", "-p", "llama3-70b", "--gpu", "h100-sxm", "--weights-dtype", "nvfp4,fp8,bf16"]
    rows = json.loads(runner.invoke(app, [*args, "-f", "json"]).stdout)
    text = " ".join(runner.invoke(app, args, env={"COLUMNS": "80"}).stdout.split())
    for row in rows:
        turning = row["decode_turning_point_batch"]
        verdict = f"decode turns compute-bound from batch {turning:,}" if turning else "decode never turns"
        assert (f"(tp 1, weights {row['weights_dtype']}, compute {row['compute_dtype']}, prompt 1,024, gen 256): "
                f"{verdict}") in text
    # bf16 weights (131.42 GiB, tfcalc memory) cannot fit one 80 GB H100, the quantized ones can
    assert [r["fits"] for r in rows] == [True, True, False]
    assert "(tp 1, pp 1, ep 1, weights bf16, compute bf16), batch 1 at context 1,280: does not fit" in text
    # one format: the sentence stays as short as before
    single = " ".join(runner.invoke(app, ARGS).stdout.split())
    assert "llama3-8b on h100-sxm (tp 1, prompt 1,024, gen 256): decode never turns" in single


def test_an_expert_parallel_row_shows_its_ep() -> None:
    # ep was a 'varies' column: a single --ep 2 row (or a sweep all at ep 2) hid it, and read as plain tp 2
    out = runner.invoke(app, ["estimate", "-p", "qwen3-30b-a3b", "--tp", "2", "--ep", "2"], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    assert [line.split() for line in out.output.splitlines()[:6]][3:6] == [["tp", "2"], ["ep", "2"], ["batch", "1"]]
    plain = runner.invoke(app, [*ARGS], env={"COLUMNS": "80"}).output
    assert not any(line.split()[:1] in (["ep"], ["pp"]) for line in plain.splitlines())


def test_low_precision_weights_without_their_tensor_cores_are_noted() -> None:
    """NVFP4 on a Hopper and fp8 on an A100 run weight-only in bf16 (no fp4 / fp8 tensor cores there): the table
    says so once per GPU and format; native rows (fp8 on the H200, nvfp4 on the B200) get no such note, and a dense
    model's rates name no MoE kernel."""
    result = runner.invoke(app, ["estimate", "-p", "llama3-70b", "-w", "nvfp4,fp8", "--gpu", "h200,a100-80gb,b200",
                                 "--tp", "2"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if "tensor cores" in line]
    assert [n.split(":")[1].strip() for n in notes] == ["nvfp4 weights on h200", "nvfp4 weights on a100-80gb",
                                                        "fp8_e4m3 weights on a100-80gb"]
    assert "(W4A16)" in notes[0] and "(W8A16)" in notes[2]
    assert "MoE" not in result.output
