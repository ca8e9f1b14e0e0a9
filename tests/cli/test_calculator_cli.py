"""Every calculator command and format through Typer's CliRunner, and every error path."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcalc.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_kv_cache_table_default_context() -> None:
    result = run("kv-cache", "--preset", "llama3-70b")
    assert result.exit_code == 0, result.output
    assert "327,680 B" in result.output and "40.00 GiB" in result.output and "131,072" in result.output


def test_kv_cache_csv_exact_columns_and_sweep() -> None:
    result = run("kv-cache", "-p", "llama3-70b", "--context", "4k,32k,128k", "--batch", "1,8,64", "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert len(rows) == 9
    assert {"model", "context", "batch", "kv_dtype", "kv_bytes_per_token", "kv_cache_bytes"} <= set(rows[0])
    last = rows[-1]
    assert (last["context"], last["batch"], last["kv_bytes_per_token"]) == ("131072", "64", "327680")
    assert int(last["kv_cache_bytes"]) == 327_680 * 131_072 * 64


def test_kv_cache_compare_attention_json() -> None:
    result = run("kv-cache", "-p", "llama3-70b", "--compare-attention", "--context", "128k", "-f", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["kv_bytes_per_token"] for r in rows] == [2_621_440, 327_680, 40_960]
    assert isinstance(rows[0]["kv_cache_bytes"], int)


def test_kv_cache_compare_attention_gemma4_names_both_kv_head_counts() -> None:
    """Gemma 4 31B: 16 KV heads on its sliding layers, 4 on its global ones; MHA gives both kinds 32, MQA 1."""
    result = run("kv-cache", "-p", "gemma4-31b", "--compare-attention", "--context", "32k", "-f", "json")
    assert result.exit_code == 0, result.output
    rows = {r["attention"]: r for r in json.loads(result.output)}
    assert set(rows) == {"MHA", "GQA (as configured, 16 / 4 KV heads)", "MQA"}
    assert rows["GQA (as configured, 16 / 4 KV heads)"]["kv_bytes_per_token"] == (50 * 8192 + 10 * 4096) * 2
    assert rows["MHA"]["kv_bytes_per_token"] == (50 * 2 * 32 * 256 + 10 * 2 * 32 * 512) * 2


def test_several_models_and_a_config_in_one_table(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 2048}))
    result = run("kv-cache", "-p", "llama3-8b", "-p", "mistral-7b", "--config", str(config), "-f", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["model"] for r in rows][:2] == ["llama3-8b", "mistral-7b"] and len(rows) == 3
    assert rows[2]["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 2


def test_params_formats() -> None:
    table = run("params", "-p", "mixtral-8x7b")
    assert table.exit_code == 0 and "46.70B" in table.output and "12.88B" in table.output
    assert "experts" in table.output and "active convention" in table.output
    rows = json.loads(run("params", "-p", "mixtral-8x7b,gpt-oss-20b", "-f", "json").output)
    assert rows[0]["total_params"] == 46_702_792_704 and rows[0]["active_params"] == 12_879_925_248
    assert "input embedding" in rows[1]["active_convention"]


def test_each_active_convention_reads_on_its_own() -> None:
    # "as above" pointed at nothing when gpt-oss was alone, and at a line printed below it when it came first
    (row,) = json.loads(run("params", "-p", "gpt-oss-120b", "-f", "json").output)
    assert "above" not in row["active_convention"] and "lm_head" in row["active_convention"]
    # what it says holds: every component counted active but the input embedding (model card: 5.1B active)
    touched = sum(v for k, v in row.items() if k.endswith("_active_params") and not k.startswith("embedding"))
    assert row["active_params"] == touched == 5_132_849_472 and row["embedding_active_params"] == 0


def test_memory_mixed_precision_and_output_file(tmp_path: Path) -> None:
    out = tmp_path / "plan.csv"
    result = run("memory", "-p", "gpt-oss-120b", "--weights-dtype", "experts=mxfp4,default=bf16",
                 "--weights-dtype", "bf16", "--kv-dtype", "fp8", "--context", "128k", "-o", str(out))
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert [r["weights_dtype"] for r in rows] == ["experts=mxfp4,default=bf16", "bf16"]
    assert {"model", "context", "batch", "weights_bytes", "kv_cache_bytes", "total_bytes"} <= set(rows[0])
    for r in rows:
        assert int(r["total_bytes"]) == int(r["weights_bytes"]) + int(r["kv_cache_bytes"]) + int(r["activation_bytes"])
    assert int(rows[1]["weights_bytes"]) == 2 * 116_829_156_672


def test_memory_default_is_the_checkpoint_format() -> None:
    rows = json.loads(run("memory", "-p", "gpt-oss-120b", "-f", "json").output)
    assert rows[0]["weights_dtype"] == "experts=mxfp4,default=bf16"
    assert round(rows[0]["weights_bytes"] / 2**30, 1) == 60.8


def test_memory_says_which_layers_the_checkpoint_keeps_16_bit() -> None:
    """Llama 3.1 405B at fp8 counts its checkpoint's bf16 attention and two bf16 MLPs; the note says so, and
    says nothing for a model without such layers."""
    text = " ".join(run("memory", "-p", "llama3.1-405b", "-w", "fp8", "--context", "8k").output.split())
    assert ("llama3.1-405b: as its checkpoint ships, attention of every layer in bf16 (when fp8_e4m3); mlp of "
            "layers 0, 125 in bf16 (when fp8_e4m3)") in text
    assert "as its checkpoint ships" not in run("memory", "-p", "llama3-70b", "-w", "fp8").output


def test_presets_list_and_show() -> None:
    listing = run("presets", "list", "-f", "json")
    names = [r["name"] for r in json.loads(listing.output)]
    assert "llama3-70b" in names and "deepseek-v3" in names and len(names) == 60
    assert {"qwen3-14b", "qwen3-4b", "qwen3-1.7b", "qwen3-0.6b", "phi-4", "qwen2.5-32b", "qwen2.5-14b",
            "minimax-m3", "kimi-linear-48b-a3b", "llama-3.3-nemotron-super-49b"} <= set(names)
    shown = run("presets", "show", "llama3-70b")
    assert shown.exit_code == 0 and "num_kv_heads" in shown.output and "sku_list.py" in shown.output


def test_python_dash_m_entry_point() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "tfcalc", "kv-cache", "-p", "llama3-8b", "-f", "json"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["kv_bytes_per_token"] == 131_072


@pytest.mark.parametrize("args, code, message", [
    (["kv-cache", "-p", "llama3-7b"], 2, "did you mean llama3-70b"),
    (["kv-cache", "-p", "mixtrl-8x7b"], 2, "mixtral-8x7b"),
    (["kv-cache"], 2, "name a model"),
    (["kv-cache", "-p", "llama3-8b", "--context", "0"], 2, "must be positive"),
    (["kv-cache", "-p", "llama3-8b", "--batch", "-1"], 2, "invalid batch"),
    (["kv-cache", "-p", "llama3-8b", "--kv-dtype", "fp9"], 2, "unknown dtype 'fp9'"),
    (["memory", "-p", "llama3-8b", "--weights-dtype", "experts=mxfp4"], 2, "name a default"),
    (["kv-cache", "-p", "llama3-8b", "--format", "xml"], 2, "unknown format"),
    (["kv-cache", "-p", "llama3-8b", "-o", "out.xlsx"], 2, "cannot tell the format"),
    (["kv-cache", "-p", "llama3-8b", "-o", "/nonexistent/dir/out.csv"], 1, "does not exist"),
    (["kv-cache", "--config", "/nonexistent/config.json"], 2, "no such file"),
    # an empty list item names the option it was typed in (it read "invalid list ''")
    (["kv-cache", "-p", ""], 2, "invalid --preset '': empty"),
    (["kv-cache", "-p", "llama3-8b", "--kv-dtype", "bf16,"], 2, "invalid dtype 'bf16,': empty item"),
    (["kv-cache", "-p", "llama3-8b", "--context", "4k,,8k"], 2, "invalid context '4k,,8k': empty item"),
    (["kv-cache", "-p", "llama3-8b", "--columns", ""], 2, "invalid --columns '': empty"),
    (["plan", "-p", "llama3-8b", "--gpu", "h100-sxm,"], 2, "invalid --gpu 'h100-sxm,': empty item"),
    (["memory", "-p", "llama3-8b", "-w", "fp8,"], 2, "invalid --weights-dtype 'fp8,': empty item"),
    (["kv-cache", "-p", "llama3-8b", "--batch", "-8"], 2, "invalid batch '-8': must be positive"),
    # a name past the file system's 255 bytes (ENAMETOOLONG) was an internal error
    (["kv-cache", "-p", "a" * 300], 2, "unknown model preset 'aaaa"),
    (["kv-cache", "-c", "a" * 300 + ".json"], 1, "aaaaa.json (305 characters): File name too long"),
    (["estimate", "-p", "llama3-8b", "--calibration", "b" * 300], 1, "(300 characters): File name too long"),
    # 400 x 400 x 2 rows: refused before any work (a 2,000 x 2,000 plan ran for half an hour)
    (["kv-cache", "-p", "llama3-8b,llama3-70b", "--batch", ",".join(map(str, range(1, 401))), "--context",
      ",".join(map(str, range(1, 401)))], 2, "the lists given sweep 320,000 rows, past tfcalc's 100,000 a run"),
    (["plan", "-p", "llama3-8b", "--batch", ",".join(map(str, range(1, 401))), "--context",
      ",".join(map(str, range(1, 401)))], 2, "the lists given sweep 160,000 rows"),
])
def test_errors_are_one_line_with_exit_code(args: list[str], code: int, message: str) -> None:
    result = run(*args)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    error_lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1


@pytest.mark.parametrize("content, message", [
    ("num_layers: [1, 2\n", "malformed YAML at line"),
    ("- a\n- b\n", "expected a mapping"),
    ("hidden_size: 64\n", "missing required field 'num_layers'"),
    ("name: x\nvocab_size: 10\nhidden_size: 64\nnum_layers: 2\nnum_attention_heads: 6\nnum_kv_heads: 4\n"
     "head_dim: 16\nintermediate_size: 32\n", "not divisible by num_kv_heads"),
    ("name: x\nvocab_size: 10\nhidden_size: -64\nnum_layers: 2\nnum_attention_heads: 4\nnum_kv_heads: 4\n"
     "head_dim: 16\nintermediate_size: 32\n", "field 'hidden_size' must be positive, got -64"),
    ("name: x\nvocab_size: 10\nhidden_sise: 64\nnum_layers: 2\n", "unknown field 'hidden_sise' (did you mean "
     "'hidden_size'?)"),
    ("name: x\nvocab_size: 10\nhidden_size: 64\nnum_layers: 2\nnum_attention_heads: 4\nnum_kv_heads: 4\n"
     "head_dim: 16\nintermediate_size: 32\nmoe: {num_experts: 4, experts_per_token: 8, "
     "expert_intermediate_size: 8}\n", "experts_per_token (8) must be in 1..num_experts (4)"),
    ("name: x\nvocab_size: 10\nhidden_size: 64\nnum_layers: 2\nnum_attention_heads: 4\nnum_kv_heads: 4\n"
     "head_dim: 16\nintermediate_size: 32\nnative_dtype: bf17\n", "native_dtype"),
])
def test_bad_user_yaml_names_file_and_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(content)
    result = run("kv-cache", "-p", str(path))
    assert result.exit_code == 1, result.output
    assert str(path) in result.output and message in result.output
    assert "Traceback" not in result.output


def test_user_yaml_in_preset_format(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text("vocab_size: 1000\nhidden_size: 256\nnum_layers: 4\nnum_attention_heads: 8\nnum_kv_heads: 1\n"
                    "head_dim: 32\nintermediate_size: 512\nmax_context: 4096\n")
    rows = json.loads(run("kv-cache", "-p", str(path), "-f", "json").output)
    assert rows[0]["model"] == "tiny" and rows[0]["attention"] == "MQA"
    assert rows[0]["kv_bytes_per_token"] == 2 * 4 * 1 * 32 * 2


@pytest.mark.parametrize("command", [
    ["params", "-p", "qwen3-30b-a3b"],
    ["kv-cache", "-p", "qwen3-30b-a3b", "--context", "8k"],
    ["memory", "-p", "qwen3-30b-a3b", "--context", "8k"],
    ["presets", "list"],
    ["presets", "list", "--kind", "gpu"],
    ["presets", "show", "qwen3-30b-a3b"],
])
def test_every_calculator_command_in_every_format(command: list[str], tmp_path: Path) -> None:
    table = run(*command)
    as_csv = list(csv.DictReader(io.StringIO(run(*command, "-f", "csv").output)))
    as_json = json.loads(run(*command, "-f", "json").output)
    assert table.exit_code == 0 and any(set(line) == {"─"} for line in table.output.splitlines())  # a header rule
    assert as_csv and len(as_csv) == len(as_json) and list(as_csv[0]) == list(as_json[0])
    out = tmp_path / "rows.json"
    assert run(*command, "-o", str(out)).exit_code == 0
    assert json.loads(out.read_text()) == as_json


def test_version() -> None:
    from tfcalc import __version__

    result = run("--version")
    assert result.exit_code == 0 and result.output == f"tfcalc {__version__}\n"


def test_presets_show_without_kind_and_by_alias() -> None:
    gpu = run("presets", "show", "h100-sxm")
    assert gpu.exit_code == 0 and "gpu preset h100-sxm" in gpu.output and "memory_gib" in gpu.output
    alias = json.loads(run("kv-cache", "-p", "meta-llama/Llama-3.1-70B", "-f", "json").output)
    assert alias[0]["model"] == "llama3-70b" and alias[0]["kv_bytes_per_token"] == 327_680
    shown = run("presets", "show", "llama3-70b", "-f", "csv")
    assert shown.output.splitlines()[0] == "field,value,source"  # no footnote column outside the table
    assert "llama-3.1-70b" in shown.output  # the aliases, as one comma-separated value



def test_presets_show_cites_nested_fields_and_sections() -> None:
    """Every field gets the citation of its own key or of the nearest section the preset cites: the datasheet for
    dense_tflops.bf16 (its sources key is dense_tflops), a section's own sources block for latency.* and
    kernels.* (no longer printed as values); a list of mappings is one field per entry."""
    def rows(name: str) -> dict[str, dict]:
        return {r["field"]: r for r in json.loads(run("presets", "show", name, "-f", "json").output)}

    gpu = rows("h100-sxm")
    assert "datasheet" in gpu["dense_tflops.bf16"]["source"]
    assert gpu["dense_tflops.bf16"]["source"] == gpu["hbm_bandwidth_tb_s"]["source"]
    assert "aiconfigurator" in gpu["latency.gemm_efficiency.bf16"]["source"]
    assert not any(".sources." in field or field.startswith("sources.") for field in gpu)
    engine = rows("vllm-0.21")
    assert engine["scheduler_defaults[0].max_num_seqs"]["value"] == 1024
    assert engine["scheduler_defaults[0].max_num_seqs"]["source"]
    assert not any(".sources." in field for field in engine) and engine["kernels.cuda_graphs"]["source"]

def test_csv_booleans_read_as_booleans() -> None:
    rows = list(csv.DictReader(io.StringIO(run("kv-cache", "-p", "gemma2-27b", "--context", "8k,1m", "-f",
                                               "csv").output)))
    assert [r["exceeds_max_context"] for r in rows] == ["FALSE", "TRUE"]


def test_uncounted_mtp_layers_are_said() -> None:
    """DeepSeek-V3's checkpoint ships a multi-token-prediction layer that no count includes: params and memory
    say so (from the preset and from its config.json alike); models without one say nothing."""
    config = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs" / "deepseek-v3.json"
    for args in (["-p", "deepseek-v3"], ["-c", str(config)]):
        for command in ("params", "memory"):
            words = " ".join(run(command, *args).stdout.split())
            assert "not counted: the 1 multi-token-prediction layer its checkpoint also ships" in words, command
    assert "multi-token" not in run("params", "-p", "llama3-8b").stdout


def test_engine_and_interconnect_presets_list_and_show() -> None:
    from tfcalc.spec.presets import preset_names

    engines = json.loads(run("presets", "list", "--kind", "engine", "-f", "json").output)
    assert [r["name"] for r in engines] == preset_names("engine")
    assert {r["engine"] for r in engines if r["default"]} == {"vllm", "sglang", "trtllm"}  # one default each
    fabrics = json.loads(run("presets", "list", "--kind", "interconnect", "-f", "json").output)
    nvlink4 = next(r for r in fabrics if r["name"] == "nvlink4")
    assert nvlink4["link_bandwidth_bytes_per_s"] == 450e9 and nvlink4["custom_allreduce"] is True
    shown = run("presets", "show", "nvlink4")  # no --kind needed
    assert shown.exit_code == 0 and "interconnect preset nvlink4" in shown.output and "bandwidth_gb_s" in shown.output
    assert "engine preset vllm-0.21" in run("presets", "show", "VLLM-0.21").output
    bad = run("presets", "list", "--kind", "cpu")
    assert bad.exit_code == 2 and "choose model, gpu, engine, interconnect" in bad.stderr


def test_presets_show_an_unknown_repo_id_suggests_the_preset() -> None:
    result = run("presets", "show", "meta-llama/Llama-3.1-8B-FP8")
    assert result.exit_code == 2 and "unknown preset 'meta-llama/Llama-3.1-8B-FP8'; did you mean llama3.1-8b" in (
        result.stderr)
    assert "is not a preset name" in run("presets", "show", "../x").stderr


def test_deepseek_v4_through_every_calculator_command_and_the_profiler_refuses() -> None:
    """params, kv-cache, memory, plan, estimate and capacity read DeepSeek-V4; the profiler, whose bundled decoder
    does not run its attention, says so in one line (exit 1)."""
    kv = run("kv-cache", "-p", "deepseek-v4-flash", "--context", "1m", "-f", "json")
    assert kv.exit_code == 0, kv.output
    (row,) = json.loads(kv.output)
    assert (row["attention"], row["kv_dtype"], row["kv_heads"], row["head_dim"]) == ("CSA/HCA", "fp8_e4m3", 1, 512)
    for args in (["memory", "-p", "deepseek-v4-pro", "--context", "8k"],
                 ["plan", "-p", "deepseek-v4-flash", "-g", "h200", "-n", "8", "--context", "128k"],
                 ["estimate", "-p", "deepseek-v4-flash", "-g", "h200", "--tp", "8", "--batch", "1,16"],
                 ["capacity", "-p", "deepseek-v4-flash", "-g", "b200", "--rate", "1", "--input-len", "2000",
                  "--output-len", "200", "--ttft", "p90=2s", "--max-gpus", "8"]):
        result = run(*args, "-f", "json")
        assert result.exit_code == 0, (args, result.output)
        assert json.loads(result.output), args
    profiled = run("profile", "-p", "deepseek-v4-flash", "--device", "cpu")
    assert profiled.exit_code == 1
    assert profiled.output.strip().splitlines()[-1].startswith("error: deepseek-v4-flash: the profiler's work counts")


def test_plan_prefix_caching_flag_sets_the_hybrid_state_blocks() -> None:
    """vLLM 0.34 with prefix caching keeps 3 state blocks a Qwen3.5 request, 1 with --no-enable-prefix-caching:
    same budget, more sequences."""
    def row(*extra: str) -> dict:
        result = run("plan", "-p", "qwen3.5-27b", "--gpu", "h200", "--max-model-len", "32k", "--engine", "vllm@0.34",
                     "--format", "json", *extra)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)[0]

    on, off = row(), row("--no-enable-prefix-caching")
    assert on["kv_budget_bytes_per_gpu"] == off["kv_budget_bytes_per_gpu"]
    assert off["max_concurrent_sequences"] > on["max_concurrent_sequences"] == row("--enable-prefix-caching")[
        "max_concurrent_sequences"]


def test_sweep_limit_is_the_product_of_the_lists() -> None:
    from tfcalc.cli.common import MAX_SWEEP_ROWS, check_sweep_size
    from tfcalc.errors import UsageError

    check_sweep_size([0] * 1000, [], [0] * (MAX_SWEEP_ROWS // 1000))  # an empty list (a default) counts once
    with pytest.raises(UsageError, match=f"sweep {MAX_SWEEP_ROWS + 1:,} rows"):
        check_sweep_size([0] * (MAX_SWEEP_ROWS + 1), [0])


def test_enumerated_options_take_any_case_and_refuse_unknown_values() -> None:
    """--format CSV, --allreduce RING, --compute-dtype FP8, --fp8-scales Static, --device CPU, --kind GPU are their
    lower-case choices; unknown values are still one-line usage errors."""
    assert run("kv-cache", "-p", "llama3-8b", "-f", "CSV").stdout == run("kv-cache", "-p", "llama3-8b", "-f",
                                                                        "csv").stdout
    lower = run("estimate", "-p", "llama3-8b", "--tp", "2", "--allreduce", "ring", "--compute-dtype", "fp8",
                "--fp8-scales", "static", "-w", "fp8", "-f", "json")
    upper = run("estimate", "-p", "llama3-8b", "--tp", "2", "--allreduce", "RING", "--compute-dtype", "FP8",
                "--fp8-scales", "Static", "-w", "fp8", "-f", "JSON")
    assert lower.exit_code == 0 and upper.stdout == lower.stdout, upper.output
    assert run("presets", "list", "--kind", "GPU").stdout == run("presets", "list", "--kind", "gpu").stdout
    for args, message in ((("kv-cache", "-p", "llama3-8b", "-f", "XML"), "unknown format 'xml'"),
                          (("estimate", "-p", "llama3-8b", "--allreduce", "Bus"), "invalid --allreduce 'bus'"),
                          (("estimate", "-p", "llama3-8b", "--compute-dtype", "FP9"), "fp9")):
        result = run(*args)
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
        assert result.output.startswith("error: ") and message in result.output
    if importlib.util.find_spec("torch") is not None:  # --device CPU is the CPU: a GPU index with it is refused
        cpu = run("profile", "--device", "CPU", "--gpu", "0")
        assert cpu.exit_code == 2 and "--device cpu profiles the CPU" in cpu.output
        assert "unknown device 'tpu'" in run("profile", "--device", "TPU").output


def test_kv_cache_state_note_names_the_recurrent_layers_the_models_have() -> None:
    """The fixed-state note names each listed model's recurrent layers (Qwen3.5: Gated DeltaNet; Kimi Linear: KDA;
    Nemotron-H: Mamba-2) and no others; a model without them adds no note."""
    def note(*presets: str) -> str:
        result = run("kv-cache", "-p", ",".join(presets))
        assert result.exit_code == 0, result.output
        return " ".join(result.output.split())

    assert "Gated DeltaNet layers cache no tokens" in note("qwen3.5-27b", "llama3-8b")
    assert "KDA and Mamba-2 layers cache no tokens" in note("kimi-linear-48b-a3b", "nemotron-h-56b")
    assert "cache no tokens" not in note("llama3-8b", "deepseek-v4-flash")


def test_kv_cache_says_what_an_mla_token_holds() -> None:
    """The note under every table reads "K and V of one token"; an MLA row holds neither, and says what it holds:
    DeepSeek-V3 (config.json: kv_lora_rank 512, qk_rope_head_dim 64, 61 layers) 576 bf16 values per layer."""
    result = run("kv-cache", "-p", "deepseek-v3,llama3-8b", "--context", "4k")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "MLA caches no K and V" in text and "kv_lora_rank + qk_rope_head_dim values per MLA layer" in text
    assert "Sparse Attention" not in text  # DeepSeek-V3 has no indexer
    assert "70,272 B" in text and 70_272 == (512 + 64) * 61 * 2
    # DeepSeek-V3.2: + the indexer key, 61 x (1,152 + 132) = 78,324 B (vLLM DeepseekV32IndexerCache)
    dsa = " ".join(run("kv-cache", "-p", "deepseek-v3.2", "--context", "4k", "--kv-dtype", "bf16").output.split())
    assert "indexer's 132-byte key" in dsa and "78,324 B" in dsa
    assert "MLA caches" not in " ".join(run("kv-cache", "-p", "llama3-8b").output.split())


@pytest.mark.parametrize("command", ["kv-cache", "params", "memory", "plan"])
def test_columns_help_suggests_no_key_the_command_lacks(command: str) -> None:
    # it read "(e.g. model,ttft_s,tpot_s)" under every command; those are estimate's keys, shown empty elsewhere
    text = " ".join(runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output.replace("│", " ").split())
    assert "ttft_s" not in text and "the first line of -f csv lists this command's" in text


def test_memory_states_the_mla_attention_width_it_counts() -> None:
    """DeepSeek-V3's workspace, by hand from its config (hidden 7,168, 128 heads, qk_head_dim 128 + 64,
    v_head_dim 128, dense intermediate 18,432, 8 x 2,048 routed + 2,048 shared, vocab 129,280): attention width
    128 x (2 x 192 + 2 x 128) = 81,920 beats the FFN's 3 x 18,432 = 55,296, so 8,192 tokens x (2 x 7,168 + 81,920)
    x 2 B + 129,280 x 4 B; the note gives that width, which the GQA formula above it does not."""
    (row,) = json.loads(run("memory", "-p", "deepseek-v3", "--context", "32k", "-f", "json").output)
    assert row["activation_bytes"] == 8192 * (2 * 7168 + 128 * (2 * 192 + 2 * 128)) * 2 + 129_280 * 4
    text = " ".join(run("memory", "-p", "deepseek-v3", "--context", "32k").output.split())
    assert "MLA's attention width = heads x (2 qk_head_dim + 2 v_head_dim)" in text
    assert "MLA's attention width" not in " ".join(run("memory", "-p", "llama3-8b").output.split())
