"""``tfcalc plan`` end to end: columns, verdicts, sweeps, errors, plot."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcalc.cli import app

runner = CliRunner()
PLAN_COLUMNS = ["model", "gpu", "engine", "num_gpus", "tp", "pp", "context", "batch", "weights_dtype", "kv_dtype",
                "weights_bytes_per_gpu", "kv_budget_bytes_per_gpu", "kv_tokens_per_gpu", "max_concurrent_sequences",
                "max_context_at_batch", "fits", "capacity_bytes", "non_torch_bytes", "activation_peak_bytes",
                "cuda_graph_bytes"]


def run(*args: str):
    return runner.invoke(app, list(args))


def test_issue_example_json() -> None:
    result = run("plan", "--preset", "llama3-70b", "--gpu", "h100-sxm", "--num-gpus", "8", "--tp", "8",
                 "--context", "128k", "--weights-dtype", "fp8", "--kv-dtype", "fp8", "--format", "json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert list(row)[:len(PLAN_COLUMNS)] == PLAN_COLUMNS
    assert row["fits"] is True and row["kv_bytes_per_token_per_gpu"] == 80 * 2 * 1 * 128
    assert row["max_context_at_batch"] == 131072


def test_table_sweep_and_explain() -> None:
    result = run("plan", "-p", "llama3-8b", "--gpu", "h100-sxm,a100-40gb", "--context", "8k,32k", "--batch", "1,16",
                 "--explain")
    assert result.exit_code == 0, result.output
    assert "Available KV cache memory = " in result.stdout and "a100-40gb" in result.stdout
    assert "torch peak memory increase" in result.stdout and "Maximum concurrency" in result.stdout
    wide = run("plan", "-p", "deepseek-v3", "-tp", "8", "--explain")  # each trace's header wraps at 80 columns
    assert "# model=deepseek-v3, gpu=h100-sxm" in wide.stdout and "\n# pp=1, context=163840, batch=1" in wide.stdout
    assert all(len(line) <= 80 for line in wide.stdout.splitlines() if line.startswith("#"))


def test_redundant_experts_need_expert_parallelism() -> None:
    dense = run("plan", "-p", "llama3-8b", "--redundant-experts", "8")
    assert dense.exit_code == 2 and "--redundant-experts needs an MoE model" in dense.output
    sliced = run("plan", "-p", "deepseek-v3", "-g", "h200", "-tp", "8", "--ep", "1", "--redundant-experts", "8")
    assert sliced.exit_code == 2 and "needs whole experts per GPU" in sliced.output


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_explain_never_writes_into_csv_or_json(fmt: str) -> None:
    result = run("plan", "-p", "llama3-8b", "--num-gpus", "1,2", "--explain", "-f", fmt)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout) if fmt == "json" else list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 2 and all(None not in row and len(row) == len(rows[0]) for row in rows)  # nothing else
    assert "# model=llama3-8b" in result.stderr and "Available KV cache memory = " in result.stderr
    assert "Available KV cache memory" not in result.stdout


def test_csv_sweep_row_count() -> None:
    result = run("plan", "-p", "llama3-8b", "--num-gpus", "1,2", "--gpu-memory-utilization", "0.8,0.9", "-f", "csv")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.strip().splitlines()) == 1 + 4


def test_min_gpus() -> None:
    result = run("plan", "-p", "llama3-70b", "--gpu", "h100-sxm", "--context", "8k", "--batch", "8", "--min-gpus",
                 "-f", "json")
    assert result.exit_code == 0, result.output
    assert (json.loads(result.stdout)[0]["num_gpus"], json.loads(result.stdout)[0]["tp"]) == (4, 4)
    result = run("plan", "-p", "llama3-70b", "--context", "8k", "--batch", "8", "--min-gpus", "--pp", "1,2,3",
                 "-f", "json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)[0]
    assert (row["num_gpus"], row["tp"], row["pp"]) == (3, 1, 3)
    result = run("plan", "-p", "llama3-70b", "--min-gpus", "--num-gpus", "4")
    assert result.exit_code == 2 and "drop --num-gpus" in result.stderr


def test_min_gpus_spreads_experts_and_the_table_names_the_ep() -> None:
    """MiniMax-M2.7 in fp8 blocks: tp 8 alone cuts its experts' blocks (a one-line error when asked for), --min-gpus
    finds 8 GPUs with the experts spread (ep 8), and the table shows the ep column for that one row."""
    asked = run("plan", "-p", "minimax-m2.7", "-n", "8")
    assert asked.exit_code != 0 and "use expert parallelism" in asked.output and "Traceback" not in asked.output
    found = run("plan", "-p", "minimax-m2.7", "--min-gpus", "-f", "json")
    assert found.exit_code == 0, found.output
    row = json.loads(found.stdout)[0]
    assert (row["num_gpus"], row["tp"], row["ep"], row["fits"]) == (8, 8, 8, True)
    header = next(line for line in run("plan", "-p", "minimax-m2.7", "--min-gpus").stdout.splitlines()
                  if line.startswith("model"))
    assert " ep " in header
    plain = next(line for line in run("plan", "-p", "llama3-8b").stdout.splitlines() if line.startswith("model"))
    assert " ep " not in plain


def test_batch1_shortfall_not_the_batch_shortfall() -> None:
    # fp8 llama3-70b (embedding and lm_head in bf16) on one H100 at 128k, ideal arithmetic: budget 1.77 GiB, one
    # sequence needs 20 GiB -> 18.23 GiB short at batch 1 (the row's batch 8 is 158.23 GiB short; the message
    # speaks of batch 1)
    result = run("plan", "-p", "llama3-70b", "-w", "fp8", "--kv-dtype", "fp8", "--context", "128k", "--batch", "8",
                 "--engine", "ideal")
    assert result.exit_code == 1
    assert "even at batch 1 at context 131,072 (ideal): short by 18.23 GiB per GPU" in result.stderr


def test_every_numeric_option_takes_a_list() -> None:
    result = run("plan", "-p", "llama3-8b", "--num-gpus", "1,2", "--tp", "1", "--pp", "1", "--ep", "1",
                 "--context", "4k", "--batch", "1,2", "--gpu-memory-utilization", "0.9", "--block-size", "16,32",
                 "--runtime-overhead", "1g,2g", "--prefill-chunk", "2k,8k", "--engine", "ideal", "-f", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 2 * 2 * 2 * 2 * 2
    assert {r["runtime_overhead_bytes_per_gpu"] for r in rows} == {1 << 30, 2 << 30}


def test_does_not_fit_says_by_how_much() -> None:
    result = run("plan", "-p", "llama3-70b", "--gpu", "rtx4090", "--context", "4k")
    assert result.exit_code == 1
    assert "does not fit" in result.stderr and "short by" in result.stderr
    assert "Traceback" not in result.output


def test_unknown_gpu() -> None:
    result = run("plan", "-p", "llama3-8b", "--gpu", "h100")
    assert result.exit_code == 2 and "did you mean" in result.stderr


def test_tp_errors() -> None:
    result = run("plan", "-p", "llama3-70b", "--num-gpus", "3", "--tp", "3")
    assert result.exit_code == 2 and "does not divide the 64 attention heads" in result.stderr
    result = run("plan", "-p", "llama3-70b", "--num-gpus", "6", "--tp", "4")
    assert result.exit_code == 2 and "does not divide the GPU count" in result.stderr
    result = run("plan", "-p", "llama3-70b", "--num-gpus", "1", "--pp", "2")
    assert result.exit_code == 2 and "pp 2 does not divide the GPU count 1" in result.stderr
    result = run("plan", "-p", "llama3-70b", "--num-gpus", "3")  # the tp it names comes from --num-gpus: say so
    assert result.exit_code == 2 and result.stderr.startswith("error: --num-gpus 3 means tp 3 x pp 1"), result.stderr
    assert "tp 3 does not divide the 64 attention heads" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_utilization() -> None:
    result = run("plan", "-p", "llama3-8b", "--gpu-memory-utilization", "1.5")
    assert result.exit_code == 2 and "gpu memory utilization" in result.stderr


def test_gpu_presets_list() -> None:
    result = run("presets", "list", "--kind", "gpu", "-f", "json")
    assert result.exit_code == 0, result.output
    assert {r["name"] for r in json.loads(result.stdout)} >= {"h100-sxm", "mi300x", "b200"}


def test_plot_png(tmp_path: Path) -> None:
    path = tmp_path / "plan.png"
    result = run("plan", "-p", "llama3-8b", "--gpu", "l40s", "-w", "bf16,fp8", "--plot", str(path))
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(str(path)).shape[0] > 100


def test_plot_data_is_plan_at_each_context() -> None:
    """The plotted bytes at the row's own context are what the row says: weights + reserved + its batch's KV."""
    from tfcalc.dtypes import parse_weight_precision
    from tfcalc.report.plan import memory_by_context
    from tfcalc.spec.presets import load_engine, load_gpu, load_model

    (row,) = json.loads(run("plan", "-p", "llama3-8b", "--gpu", "l40s", "--context", "8192", "--batch", "4",
                            "-f", "json").stdout)
    title, series, capacities = memory_by_context([load_model("llama3-8b")], [load_gpu("l40s")], row,
                                                  [parse_weight_precision("bf16")], [], [load_engine("vllm")])
    ((label, contexts, values),) = series
    expected = row["weights_bytes_per_gpu"] + row["reserved_bytes_per_gpu"] + 4 * row["kv_bytes_per_sequence_per_gpu"]
    assert values[contexts.index(8192)] == expected and label == "weights bf16, KV bf16"
    assert capacities == [("l40s", load_gpu("l40s").memory_bytes)] and "batch 4" in title
    assert values == sorted(values)  # more context, more KV


def test_vllm_flag_names() -> None:
    """vLLM's own flag names, with today's kept as aliases."""
    result = run("plan", "-p", "llama3-70b", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
                 "--max-model-len", "32k", "--kv-cache-dtype", "fp8", "--max-num-seqs", "256",
                 "--max-num-batched-tokens", "4096", "--gpu-memory-utilization", "0.92", "--block-size", "32",
                 "-f", "json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert (row["num_gpus"], row["tp"], row["pp"], row["context"], row["kv_dtype"]) == (8, 4, 2, 32768, "fp8_e4m3")
    assert (row["max_num_seqs"], row["max_num_batched_tokens"], row["memory_fraction"], row["block_size"]) == (
        256, 4096, 0.92, 32)
    short = run("plan", "-p", "llama3-70b", "-tp", "4", "-pp", "2", "--context", "32k", "--kv-dtype", "fp8",
                "--prefill-chunk", "4096", "--max-num-seqs", "256", "--gpu-memory-utilization", "0.92",
                "--block-size", "32", "-f", "json")
    assert short.exit_code == 0 and json.loads(short.stdout) == [row]


def test_tp_alone_implies_the_gpu_count() -> None:
    result = run("plan", "-p", "llama3-70b", "--tp", "8", "-f", "json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert (row["num_gpus"], row["tp"], row["pp"], row["dp"]) == (8, 8, 1, 1)


def test_engines_compare_and_name_themselves() -> None:
    result = run("plan", "-p", "llama3-8b", "--engine", "vllm,vllm@0.19,sglang,trtllm,ideal", "-f", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["engine"] for r in rows] == ["vllm 0.20-0.21", "vllm 0.17-0.19", "sglang 0.5.10+", "trtllm 1.0+", "ideal"]
    assert rows[1]["kv_budget_bytes_per_gpu_ideal"] == rows[4]["kv_budget_bytes_per_gpu"]  # both at 0.9
    assert rows[0]["memory_fraction"] == 0.92 and rows[0]["kv_budget_bytes_per_gpu_ideal"] > rows[4][
        "kv_budget_bytes_per_gpu"]
    assert rows[4]["kv_budget_bytes_per_gpu_ideal"] is None
    assert all(r["capacity_bytes"] == round(79.19 * (1 << 30)) for r in rows[:4])


def test_gpt_fast_plans_with_the_plain_arithmetic_and_says_so() -> None:
    """gpt-fast keeps a static KV cache, no pool: its preset says budget: ideal, so its figures are ideal's, the
    row is labelled gpt-fast, the note and the trace say which arithmetic it was, and --runtime-overhead applies."""
    result = run("plan", "-p", "llama3-8b", "--max-model-len", "8k", "--engine", "gpt-fast,ideal", "--runtime-overhead",
                 "2g", "-f", "json")
    assert result.exit_code == 0, result.output
    fast, ideal = json.loads(result.stdout)
    assert fast["engine"] == "gpt-fast" and ideal["engine"] == "ideal"
    for key in ("weights_bytes_per_gpu", "kv_budget_bytes_per_gpu", "kv_tokens_per_gpu", "max_concurrent_sequences",
                "reserved_bytes_per_gpu", "runtime_overhead_bytes_per_gpu", "capacity_bytes"):
        assert fast[key] == ideal[key], key
    assert fast["runtime_overhead_bytes_per_gpu"] == 2 << 30 and fast["kv_budget_bytes_per_gpu_ideal"] is None
    table = run("plan", "-p", "llama3-8b", "--max-model-len", "8k", "--engine", "gpt-fast", "--explain")
    text = " ".join(table.stdout.split())
    assert "gpt-fast: no KV pool of its own to model" in text and "memory by the ideal arithmetic" in text
    assert "runtime capacity of" not in text  # the plain arithmetic uses the nominal capacity by design



@pytest.mark.parametrize("command", ["plan", "estimate"])
def test_runtime_overhead_needs_an_engine_that_uses_it(command: str) -> None:
    """A serving engine's budget measures startup's memory itself: --runtime-overhead with only such engines was
    accepted and changed nothing; beside ideal or gpt-fast it applies to those rows."""
    refused = run(command, "-p", "llama3-8b", "-g", "h100-sxm", "-e", "vllm,sglang", "--runtime-overhead", "2g")
    assert refused.exit_code == 2
    assert "--runtime-overhead applies to --engine ideal or gpt-fast only; the budget of vllm, sglang" in \
        refused.output
    assert run(command, "-p", "llama3-8b", "-g", "h100-sxm", "-e", "vllm,ideal", "--runtime-overhead",
               "2g").exit_code == 0

def test_engine_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("TFCALC_ENGINE", "vllm@0.19")
    result = run("plan", "-p", "llama3-8b", "-f", "json")
    assert result.exit_code == 0 and json.loads(result.stdout)[0]["engine"] == "vllm 0.17-0.19"


def test_explain_names_each_term_as_the_engine_logs_it() -> None:
    result = run("plan", "-p", "gemma2-27b", "--max-model-len", "8k", "--engine", "vllm@0.19", "--explain")
    assert result.exit_code == 0, result.output
    for words in ("total_memory (cudaMemGetInfo)", "requested memory", "Model loading took",
                  "torch peak memory increase", "non-torch forward increase memory", "Estimated CUDA graph memory",
                  "not subtracted", "Available KV cache memory", "GPU KV cache size", "2 groups",
                  "Maximum concurrency", "ideal arithmetic beside it"):
        assert words in result.stdout, words
    sglang = run("plan", "-p", "llama3-8b", "--engine", "sglang", "--explain")
    assert "mem_fraction_static" in sglang.stdout and "max_total_num_tokens" in sglang.stdout


def test_bad_engine_and_search_bounds() -> None:
    result = run("plan", "-p", "llama3-8b", "--engine", "vlm")
    assert result.exit_code == 2 and "unknown engine" in result.stderr
    result = run("plan", "-p", "llama3-8b", "--engine", "vllm@0.7")
    assert result.exit_code == 2 and "covers version 0.7" in result.stderr
    result = run("plan", "-p", "llama3-70b", "--min-gpus", "--max-gpus", "-1")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "--max-gpus (-1)" in result.stderr
    result = run("plan", "-p", "llama3-70b", "--min-gpus", "--max-gpus", "1000000000", "--context", "8k",
                 "--batch", "64", "-f", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["fits"] is True


def test_a_modelopt_checkpoint_is_planned_with_the_kv_format_its_engine_uses(tmp_path: Path) -> None:
    """A ModelOpt FP8 checkpoint folder (config.json + hf_quant_config.json declaring an FP8 KV cache): fp8 weights
    everywhere; an fp8 cache, twice the tokens, under TensorRT-LLM and vLLM 0.21, a bf16 one under vLLM 0.11."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
    (tmp_path / "config.json").write_text((fixtures / "llama3-70b.json").read_text())
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}))
    rows = {}
    for engine in ("trtllm", "vllm", "vllm@0.11"):
        result = run("plan", "-c", str(tmp_path), "--gpu", "h200", "--engine", engine, "--format", "csv")
        assert result.exit_code == 0, result.output
        rows[engine] = next(csv.DictReader(io.StringIO(result.output)))
    assert {e: (r["weights_dtype"], r["kv_dtype"]) for e, r in rows.items()} == {
        "trtllm": ("fp8_e4m3", "fp8_e4m3"), "vllm": ("fp8_e4m3", "fp8_e4m3"), "vllm@0.11": ("fp8_e4m3", "bf16")}
    assert int(rows["vllm"]["kv_tokens_per_gpu"]) > 1.9 * int(rows["vllm@0.11"]["kv_tokens_per_gpu"])
    assert "KV cache fp8_e4m3 as the checkpoint declares" in rows["trtllm"]["note"]
    assert "the checkpoint declares fp8_e4m3 for the KV cache; this row holds bf16" in rows["vllm@0.11"]["note"]


def test_vllm_022_028_rows_name_their_model_runner() -> None:
    """`--engine vllm@0.22,vllm@0.23`: Llama 3 8B runs on V1 in 0.22 and V2 in 0.23 (a dense, unquantized Llama),
    which the CSV's model_runner column, the note and --explain say; an fp8 checkpoint stays on V1 in 0.23."""
    result = run("plan", "-p", "llama3-8b", "--max-model-len", "8k", "--engine", "vllm@0.22,vllm@0.23",
                 "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert [(r["engine"], r["model_runner"]) for r in rows] == [("vllm 0.22", "V1"), ("vllm 0.23", "V2")]
    assert "vllm 0.23 runs LlamaForCausalLM on its V2 model runner" in rows[1]["note"]
    assert rows[1]["cuda_graphs_in_budget"] == "FALSE" and rows[0]["cuda_graphs_in_budget"] == "TRUE"
    fp8 = run("plan", "-p", "llama3-8b", "--engine", "vllm@0.23", "-w", "fp8", "--format", "json")
    assert json.loads(fp8.output)[0]["model_runner"] == "V1"
    explain = run("plan", "-p", "llama3-8b", "--engine", "vllm@0.23", "--explain")
    assert "vLLM 0.23 (V2 model runner)" in explain.output and "not estimated" in explain.output


def test_prefix_caching_defaults_as_the_release_does() -> None:
    """Hybrid models keep prefix caching off unless asked in vLLM 0.26 (1 state block a request), on in 0.28 (2)."""
    def blocks(*flags: str) -> tuple[int, int]:
        result = run("plan", "-p", "qwen3.5-27b", "-g", "h200", "--max-model-len", "32k", "--format", "json", *flags)
        assert result.exit_code == 0, result.output
        (row,) = json.loads(result.output)
        return row["kv_blocks_per_gpu"], row["max_concurrent_sequences"]

    assert blocks("--engine", "vllm@0.26") == blocks("--engine", "vllm@0.28", "--no-enable-prefix-caching")
    assert blocks("--engine", "vllm@0.26", "--enable-prefix-caching") == blocks("--engine", "vllm@0.28")
    assert blocks("--engine", "vllm@0.26")[1] > blocks("--engine", "vllm@0.28")[1]


def test_model_runner_can_be_forced_as_vllm_s_environment_does() -> None:
    """--model-runner V1 / V2 (VLLM_USE_V2_MODEL_RUNNER=0 / 1) overrides the release's choice by model where a
    release has two runners, leaves other engines alone, and refuses a runner no engine asked has."""
    def runner_of(*flags: str) -> list[tuple[str, str]]:
        result = run("plan", "-p", "qwen3-30b-a3b", "--max-model-len", "8k", "--format", "csv", *flags)
        assert result.exit_code == 0, result.output
        return [(r["engine"], r["model_runner"]) for r in csv.DictReader(io.StringIO(result.output))]

    assert runner_of("--engine", "vllm@0.25") == [("vllm 0.25", "V1")]  # MoE: V1 by default
    assert runner_of("--engine", "vllm@0.25,sglang", "--model-runner", "v2") == [("vllm 0.25", "V2"),
                                                                                  ("sglang 0.5.10+", "")]
    for flags, message in ((("--engine", "vllm@0.25", "--model-runner", "V3"), "must be V1 or V2 for vllm 0.25"),
                           (("--engine", "vllm@0.34", "--model-runner", "V1"), "no engine asked has two")):
        result = run("plan", "-p", "llama3-8b", *flags)
        assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output


def test_vllm_034_extensible_cache_can_be_turned_off() -> None:
    """--no-enable-extensible-kv-cache plans vLLM 0.34+ as it sizes its cache without one (0.33's way at 0.92,
    64-token blocks): fewer KV tokens than by default; other engines are left alone, and asking it of none is a
    one-line error."""
    def tokens(*flags: str) -> list[tuple[str, int]]:
        result = run("plan", "-p", "llama3-8b", "--max-model-len", "8k", "--format", "csv", *flags)
        assert result.exit_code == 0, result.output
        return [(r["engine"], int(r["kv_tokens_per_gpu"])) for r in csv.DictReader(io.StringIO(result.output))]

    (default,), (on,) = tokens("--engine", "vllm@0.34"), tokens("--engine", "vllm@0.34", "--enable-extensible-kv-cache")
    (off, v33) = tokens("--engine", "vllm@0.34,vllm@0.33", "--no-enable-extensible-kv-cache")
    assert default == on and off[0] == "vllm 0.34+" and off[1] < on[1]
    assert off[1] % 64 == 0 and abs(off[1] - v33[1]) < 64 and v33 == tokens("--engine", "vllm@0.33")[0]
    result = run("plan", "-p", "llama3-8b", "--engine", "vllm", "--no-enable-extensible-kv-cache")
    assert result.exit_code != 0 and "no engine asked has an extensible KV cache" in result.output
    assert "Traceback" not in result.output


def test_kv_cache_memory_bytes_is_vllm_s_set_kv_cache() -> None:
    """--kv-cache-memory-bytes (or --kv-cache-memory) sets vLLM's KV cache per GPU; other engines in the same sweep
    size theirs; past what the GPU holds the row says by how much; an engine-less request is a one-line error."""
    result = run("plan", "-p", "llama3-8b", "--max-model-len", "8k", "--engine", "vllm,sglang", "--format", "csv",
                 "--kv-cache-memory-bytes", "40g")
    assert result.exit_code == 0, result.output
    vllm, sglang = csv.DictReader(io.StringIO(result.output))
    assert int(vllm["kv_budget_bytes_per_gpu"]) == 40 << 30 and int(sglang["kv_budget_bytes_per_gpu"]) != 40 << 30
    too_big = run("plan", "-p", "llama3-8b", "--max-model-len", "8k", "--kv-cache-memory", "70g")
    assert too_big.exit_code == 0 and "runs out of memory" in " ".join(too_big.stdout.split())
    for flags, message in ((("--engine", "sglang"), "no engine asked takes it"), ((), "must be positive")):
        bad = run("plan", "-p", "llama3-8b", "--kv-cache-memory", "0" if not flags else "1g", *flags)
        assert bad.exit_code != 0 and message in bad.output and "Traceback" not in bad.output


def test_the_default_scheduler_limits_are_the_ones_help_names() -> None:
    """--help: vLLM 1024 sequences / 8192 tokens on GPUs of >= 70 GiB but the A100, else 256 / 2048 (vLLM
    EngineArgs._set_default_args: device memory >= 70 GiB and "a100" not in the device name); it said ">= 70 GiB"
    alone, which an A100 80GB reader takes to mean 1024."""
    def limits(gpu: str) -> tuple[int, int]:
        (row,) = json.loads(CliRunner().invoke(app, ["plan", "-p", "llama3-8b", "--gpu", gpu, "-f", "json"]).output)
        return row["max_num_seqs"], row["max_num_batched_tokens"]

    assert limits("h100-sxm") == (1024, 8192) and limits("a100-80gb") == (256, 2048) and limits("l40s") == (256, 2048)
    help_text = " ".join(CliRunner().invoke(app, ["plan", "--help"], env={"COLUMNS": "200"}).output
                         .replace("│", " ").split())
    assert "vLLM 1024 on GPUs of >= 70 GiB but the A100, else 256" in help_text
    assert "vLLM 8192 on GPUs of >= 70 GiB but the A100, else 2048" in help_text


def test_explanations_count_one_gpu_in_the_singular() -> None:
    def said(*args: str) -> str:
        return " ".join(CliRunner().invoke(app, [*args, "--explain"], env={"COLUMNS": "200"}).output.split())

    assert "dp 1 = 1 GPU, ep 1" in said("plan", "-p", "llama3-8b")
    assert "dp 1 = 2 GPUs, ep 1" in said("plan", "-p", "llama3-8b", "--tp", "2")
    assert "dp 1 = 1 GPU, ep 1" in said("estimate", "-p", "llama3-8b")
    assert "cost: 1 GPU x $" in said("capacity", "-p", "llama3.2-1b", "--rate", "1", "--input-len", "512",
                                     "--output-len", "64", "--tpot", "p90=100ms", "--gpu", "l4", "--tp", "1")
