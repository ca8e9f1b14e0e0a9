"""``tfcalc capacity`` end to end: the table (80 columns: tests/cli/test_widths.py), CSV/JSON (frontier summary and
every point), plot, explain, launch command lines for three engines with the checkpoint to serve, the shared engine
flags, and one-line errors for bad input."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcalc.cli import app
from tfcalc.cli.capacity import parse_duration, parse_targets
from tfcalc.errors import UsageError
from tfcalc.spec.presets import load_gpu

runner = CliRunner()
SMALL = ["capacity", "-p", "llama3-8b", "--gpu", "h100-sxm,l40s", "--tp", "1,2", "--max-num-seqs", "32,128",
         "--max-num-batched-tokens", "2048", "--rate", "8", "--input-len", "1000", "--output-len", "200", "--ttft",
         "p90=800ms", "--tpot", "p90=60ms", "--sim-requests", "400"]
# a small llama3-8b search on one H100 at tp 1, for the engine-flag tests
ONE_H100 = ["capacity", "-p", "llama3-8b", "--gpu", "h100-sxm", "--tp", "1", "--max-num-seqs", "64",
            "--max-num-batched-tokens", "2048", "--rate", "2", "--input-len", "1000", "--output-len", "200",
            "--ttft", "p90=1s", "--tpot", "p90=60ms", "--no-simulate"]


def run(*args: str):
    return runner.invoke(app, list(args))


def test_table_names_the_plan_and_the_checkpoint_to_serve() -> None:
    result = run(*SMALL)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "cheapest plan for llama3-8b at 8 req/s" in " ".join(out.split())
    assert "per million input" in out and "per million output" in out
    repo = "meta-llama/Meta-Llama-3-8B-Instruct"  # the preset's hf_repo, never the preset's own name
    assert f"vllm serve {repo} \\\n" in out and "--max-num-seqs" in out and "--tensor-parallel-size" in out
    assert "sglang.launch_server" in out and f"--model-path {repo} \\\n" in out and "--max-running-requests" in out
    assert f"trtllm-serve {repo} \\\n" in out and "--max_batch_size" in out and "--tp_size" in out
    assert "extra.yml:\n" in out and "kv_cache_config: {enable_block_reuse: false" in out
    assert "llama3-8b \\" not in out
    assert "note:" not in out   # both GPUs' kernels were measured on them
    assert "simulation of one of 1 replica(s)" in out or "simulation of one of 2 replica(s)" in out
    assert "Pareto frontier" in out



def test_the_chosen_plan_reports_its_simulation_beside_the_model() -> None:
    """Where the simulation confirmed the plan, the sentence gives its values first (the model's beside them) and
    the JSON summary's chosen row carries them; each within its target."""
    text = " ".join(run(*SMALL).stdout.split())
    assert re.search(r"TTFT p90 [\d,.]+ ms simulated, [\d,.]+ ms by the model \(target 800 ms\)", text), text
    chosen = json.loads(run(*SMALL, "-f", "json").stdout)[0]
    assert chosen["role"] == "chosen"
    assert 0 < chosen["simulated_ttft_p90_s"] <= 0.8 and 0 < chosen["simulated_tpot_p90_s"] <= 0.06
    unchecked = json.loads(run(*SMALL, "--no-simulate", "-f", "json").stdout)[0]
    assert not any(key.startswith("simulated_") for key in unchecked)

def test_the_default_question_answers_in_an_80_column_table() -> None:
    """The issue's question with every default: Llama 3 70B, 2 req/s, 1k in / 256 out, TTFT p90 1 s, TPOT p90
    50 ms, over every priced GPU."""
    from rich.cells import cell_len

    result = runner.invoke(app, ["capacity", "-p", "llama3-70b", "--rate", "2", "--input-len", "1k", "--output-len",
                                 "256", "--ttft", "p90=1s", "--tpot", "p90=50ms", "--sim-requests", "300",
                                 "--workers", "1"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80 and "…" not in result.stdout
    words = " ".join(result.stdout.split())
    assert "cheapest plan for llama3-70b at 2 req/s" in words
    assert "-> meets the targets" in words
    # a plan on a GPU tfcalc has no kernel measurements of says so (measured_on: none, as presets/gpus/mi300x.yaml)
    chosen = re.search(r"cheapest plan for llama3-70b at 2 req/s: .*? = \d+ x ([\w-]+), weights", words).group(1)
    unmeasured = load_gpu(chosen).latency.measured_on == "none"
    assert (f"note: {chosen}: tfcalc has no kernel measurements" in words) == unmeasured


def test_every_point_in_long_format_and_a_summary_by_default() -> None:
    csv_out = run(*SMALL, "--format", "csv", "--no-simulate", "--points", "all")
    assert csv_out.exit_code == 0, csv_out.output
    rows = list(csv.DictReader(io.StringIO(csv_out.stdout)))
    assert {"engine", "gpu", "tp", "max_num_seqs", "metric", "value", "unit"} <= set(rows[0])
    configs = {(r["gpu"], r["tp"], r["weights_dtype"], r["kv_dtype"], r["max_num_seqs"]) for r in rows}
    assert len(configs) == 2 * 2 * 2 * 2 * 2      # GPUs x tp x weights x KV x seqs (one chunk size)
    chosen = [r for r in rows if r["metric"] == "chosen" and r["value"].lower() == "true"]
    assert len(chosen) == 1
    json_out = run(*SMALL, "--format", "json", "--no-simulate", "--points", "all")
    data = json.loads(json_out.stdout)
    assert len(data) == len(rows)
    costs = [r for r in data if r["metric"] == "cost_per_hour" and r["value"] is not None]
    assert all(isinstance(r["value"], float) for r in costs)
    summary = json.loads(run(*SMALL, "--format", "json", "--no-simulate").stdout)
    roles = [r["role"] for r in summary]
    assert roles.count("chosen") == 1 and "frontier" in roles or "cheapest" in roles
    assert len(summary) < len(configs) + 1 and len(json.dumps(summary)) < len(json_out.stdout) / 5
    first = summary[0]
    assert first["role"] == "chosen" and first["cost_per_hour"] > 0 and first["operating_ttft_p90_s"] <= 0.8
    assert first["cost_per_million_output_tokens"] > 0


def test_json_path_imports_neither_torch_nor_pandas() -> None:
    probe = ("import json, sys\nfrom tfcalc.cli import app\ntry:\n    app({args!r})\nexcept SystemExit:\n    pass\n"
             "print(json.dumps(sorted(m for m in ('torch', 'pandas') if m in sys.modules)), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe.format(args=[*SMALL, "-f", "json", "--no-simulate"])],
                          capture_output=True, text=True, check=False)
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []


def test_plot_and_explain(tmp_path: Path) -> None:
    png = tmp_path / "frontier.png"
    result = run(*SMALL, "--plot", str(png), "--explain", "--no-simulate")
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "# llama3-8b" in result.stdout and "TTFT = request latency" in result.stdout
    assert "API server (1 process(es))" in result.stdout and "per-operation latency model" in result.stdout
    assert "capacity: one replica carries" in result.stdout
    assert result.stdout.index("Pareto frontier") < result.stdout.index("TTFT = request latency")  # after the tables
    as_json = run(*SMALL, "--explain", "--no-simulate", "-f", "json")  # the trace goes to stderr: stdout parses
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)[0]["role"] == "chosen"
    assert "TTFT = request latency" in as_json.stderr and "TTFT = request latency" not in as_json.stdout


# GPU presets priced in presets/prices.yaml on 2026-12-07 (tests/spec/test_prices.py checks each against its source)
NEWLY_PRICED = ("h100-pcie", "b300", "a100-40gb", "a10", "rtx5090", "gb200", "mi325x", "gh200")
ONE_GPU_SEARCH = ["--tp", "1", "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--rate", "2",
                  "--input-len", "1000", "--output-len", "200", "--ttft", "p90=2s", "--tpot", "p90=100ms",
                  "--no-simulate", "-f", "json"]


@pytest.mark.parametrize("gpu", NEWLY_PRICED)
def test_a_newly_priced_gpu_is_searched_without_price(gpu: str) -> None:
    """``--gpu NAME`` with no --price takes the bundled price, and the default search (no --gpu) covers it."""
    from tfcalc.spec.prices import load_prices

    result = run("capacity", "-p", "llama3-8b", "--gpu", gpu, *ONE_GPU_SEARCH)
    assert result.exit_code == 0, result.output
    chosen = json.loads(result.stdout)[0]
    assert chosen["gpu"] == gpu and chosen["price_per_gpu_hour"] == load_prices()[gpu].usd_per_gpu_hour
    assert chosen["cost_per_hour"] == pytest.approx(chosen["num_gpus"] * chosen["price_per_gpu_hour"])


def test_the_default_search_covers_every_priced_gpu() -> None:
    from tfcalc.spec.prices import load_prices

    result = run("capacity", "-p", "llama3-8b", *ONE_GPU_SEARCH, "--points", "all")
    assert result.exit_code == 0, result.output
    searched = {row["gpu"] for row in json.loads(result.stdout)}
    assert searched == set(load_prices()) and set(NEWLY_PRICED) <= searched


def test_price_tier_keeps_one_kind_of_rate() -> None:
    """--price-tier hyperscaler searches only the GPUs priced at a hyperscaler's rate (AWS's A10G, OCI's GB300);
    a --price joins any tier; the note names the rate the plan is costed at and, when the GPUs searched mix
    neocloud and hyperscaler rates, says so."""
    from tfcalc.spec.prices import load_prices

    hyperscaler = {g for g, p in load_prices().items() if p.provider_kind == "hyperscaler"}
    result = run("capacity", "-p", "llama3-8b", *ONE_GPU_SEARCH, "--points", "all", "--price-tier", "hyperscaler")
    assert result.exit_code == 0, result.output
    assert {row["gpu"] for row in json.loads(result.stdout)} == hyperscaler == {"a10g", "gb300"}
    base = ["capacity", "-p", "llama3-8b", "--tp", "1", "--rate", "1", "--tpot", "p90=100ms", "--no-simulate"]
    result = run(*base, "--gpu", "a10g,l4", "--price-tier", "neocloud", "--price", "a10g=0.3")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "price: a10g at $0.300 per GPU-hour, given with --price" in text and "mix" not in text
    result = run(*base, "--gpu", "a10g,l4")
    text = " ".join(result.stdout.split())
    assert "price: l4 at $0.468 per GPU-hour, a neocloud rate (page undated; read 2026-12-01;" in text
    assert "mix neocloud and hyperscaler rates (hyperscaler: a10g): --price-tier neocloud" in text


def test_presets_show_gives_a_gpus_price_and_its_kind() -> None:
    result = run("presets", "show", "gb300", "-f", "json")
    assert result.exit_code == 0, result.output
    rows = {row["field"]: row for row in json.loads(result.stdout)}
    assert rows["price.usd_per_gpu_hour"]["value"] == 18.0 and rows["price.provider_kind"]["value"] == "hyperscaler"
    assert rows["price.as_of"]["value"] == "2026-09-19" and "oracle.com" in rows["price.as_of"]["source"]
    unpriced = run("presets", "show", "h20", "-f", "json")
    assert not [row for row in json.loads(unpriced.stdout) if row["field"].startswith("price.")]


def test_concurrency_options_and_overrides() -> None:
    result = run("capacity", "-p", "llama3-8b", "--gpu", "h100-sxm", "--price", "h100-sxm=2.00", "-tp", "1",
                 "--max-num-seqs", "64", "--prefill-chunk", "2048", "--concurrency", "40", "--length-dist",
                 "lognormal", "--input-spread", "0.5", "--ttft", "mean=500ms", "--e2e", "p99=30s", "--speculative",
                 "3", "--acceptance", "0.7", "--prefix-hit", "0.3", "--request-overhead", "20ms",
                 "--api-server-count", "2", "--api-token-overhead", "80us", "--no-simulate")
    assert result.exit_code == 0, result.output
    assert "$2.00" in result.stdout or "2.00" in result.stdout
    assert "40 concurrent requests" in result.stdout
    assert "--api-server-count 2" in result.stdout


def test_engines_are_searched_like_plan_reads_them() -> None:
    """--engine takes what plan and estimate take (a family, a version, a preset, ideal) and lists compare; the
    chosen engine's command comes first and its memory model sizes the KV cache."""
    base = ["capacity", "-p", "llama3-8b", "--gpu", "h100-sxm", "--tensor-parallel-size", "1", "--max-num-seqs",
            "64", "--max-num-batched-tokens", "2048", "--rate", "4", "--ttft", "p90=1s", "--no-simulate",
            "--gpu-memory-utilization", "0.85"]
    result = run(*base, "--engine", "sglang,vllm@0.11,ideal", "-f", "json", "--points", "all")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    engines = {r["engine"] for r in data}
    assert engines == {"sglang 0.5.10+", "vllm 0.11-0.16", "ideal"}
    kv = {r["engine"]: r["value"] for r in data if r["metric"] == "kv_capacity_tokens_per_replica"
          and r["weights_dtype"] == "bf16" and r["kv_dtype"] == "bf16"}
    assert len(set(kv.values())) == 3          # three memory models, three KV pools
    table = run(*base, "--engine", "trtllm")
    assert table.exit_code == 0, table.output
    out = table.stdout
    assert out.index("trtllm-serve") < out.index("vllm serve") and "--kv_cache_free_gpu_memory_fraction 0.85" in out
    assert "--gpu-memory-utilization 0.85" in out and "--mem-fraction-static 0.85" in out


def test_sglang_mixed_chunk_changes_the_policy_and_the_launch_flags() -> None:
    """SGLang's default runs prefill steps of their own first; --enable-mixed-chunk mixes them into the decode step,
    which moves TTFT and TPOT, and its command line says so; without an SGLang engine the flag is an error."""
    base = ["capacity", "-p", "llama3-8b", "--gpu", "h100-sxm", "--tp", "1", "--max-num-seqs", "128",
            "--max-num-batched-tokens", "2048", "--rate", "15", "--input-len", "1000", "--output-len", "200",
            "--ttft", "p90=2s", "--tpot", "p90=100ms", "--no-simulate", "--engine", "sglang", "-w", "bf16",
            "--kv-dtype", "bf16"]

    def chosen(*extra: str) -> dict:
        result = run(*base, *extra, "-f", "json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)[0]

    first, mixed = chosen(), chosen("--enable-mixed-chunk")
    assert "--enable-mixed-chunk" in mixed["launch_command"] and "--enable-mixed-chunk" not in first["launch_command"]
    assert mixed["operating_ttft_p90_s"] > first["operating_ttft_p90_s"]
    assert mixed["operating_tpot_p90_s"] < first["operating_tpot_p90_s"]
    explained = run(*base, "--explain").stdout
    assert "SGLang: prefill first, decode waits" in " ".join(explained.split())
    assert "busy steps carry" in run(*base, "--explain", "--enable-mixed-chunk").stdout
    error = run(*base[:-6], "--enable-mixed-chunk")
    assert error.exit_code == 2 and "--enable-mixed-chunk is SGLang's" in error.output


def test_itl_targets() -> None:
    result = run("capacity", "-p", "llama3-8b", "--gpu", "h100-sxm", "--tp", "1", "--max-num-seqs", "64,256",
                 "--max-num-batched-tokens", "512,8192", "--rate", "10", "--itl", "p99=40ms", "--ttft", "p90=2s",
                 "--sim-requests", "400", "-f", "json", "--no-simulate")
    assert result.exit_code == 0, result.output
    chosen = json.loads(result.stdout)[0]
    assert 0 < chosen["operating_itl_p99_s"] <= 0.04


def test_lengths_csv(tmp_path: Path) -> None:
    path = tmp_path / "requests.csv"
    path.write_text("input_tokens,output_tokens\n500,100\n1500,300\n900,50\n")
    result = run("capacity", "-p", "llama3-8b", "--gpu", "h100-sxm", "--tp", "1", "--max-num-seqs", "64",
                 "--max-num-batched-tokens", "2048", "--rate", "5", "--lengths-csv", str(path), "--ttft", "p90=1s",
                 "--no-simulate")
    assert result.exit_code == 0, result.output
    refused = run("capacity", "-p", "llama3-8b", "--rate", "5", "--lengths-csv", str(path), "--ttft", "p90=1s",
                  "-o", str(path))
    assert refused.exit_code == 2 and "refusing to overwrite an input" in refused.output
    assert path.read_text().startswith("input_tokens,output_tokens\n500,100")
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt,completion\n1,2\n")
    result = run("capacity", "-p", "llama3-8b", "--rate", "5", "--lengths-csv", str(bad), "--ttft", "p90=1s")
    assert result.exit_code == 2 and "needs columns input_tokens and output_tokens" in result.output
    ignored = run("capacity", "-p", "llama3-8b", "--rate", "5", "--lengths-csv", str(path), "--ttft", "p90=1s",
                  "--input-len", "4k", "--length-dist", "lognormal")  # the file's lengths, not these
    assert ignored.exit_code == 2, ignored.output
    assert "--lengths-csv gives the request lengths: drop --input-len, --length-dist" in ignored.output


def test_lengths_csv_as_a_spreadsheet_writes_it(tmp_path: Path) -> None:
    """A byte-order mark and spaces around the column names (Excel's "CSV UTF-8") read as the plain file does;
    a length past units.MAX_TOKENS is refused on its line."""
    from tfcalc.cli.capacity import read_lengths_csv

    plain, excel = tmp_path / "plain.csv", tmp_path / "excel.csv"
    plain.write_text("input_tokens,output_tokens\n500,100\n1500,300\n")
    excel.write_bytes(b"\xef\xbb\xbfinput_tokens , output_tokens\r\n500,100\r\n1500,300\r\n")
    assert read_lengths_csv(excel) == read_lengths_csv(plain)
    assert read_lengths_csv(plain)[0].values == (500, 1500)
    for text, message in (("input_tokens,input_tokens,output_tokens\n1,2,3\n", "column input_tokens appears twice"),
                          ("input_tokens,output_tokens\n500,100,7\n", "plain.csv:2: 3 cells, the header names 2"),
                          ("input_tokens,output_tokens\n500,100\n\n\nx,1\n", "plain.csv:5: input_tokens and")):
        plain.write_text(text)  # never a column silently dropped or chosen, and errors at the file's own line
        with pytest.raises(UsageError, match=message):
            read_lengths_csv(plain)
    plain.write_bytes(b"input_tokens,output_tokens\n\xff\xfe,1\n")
    with pytest.raises(UsageError, match="plain.csv: not UTF-8 text"):
        read_lengths_csv(plain)
    with pytest.raises(UsageError, match="is a folder, not a file"):
        read_lengths_csv(tmp_path)
    huge = tmp_path / "huge.csv"
    huge.write_text(f"input_tokens,output_tokens\n500,100\n{2**41},1\n")
    with pytest.raises(UsageError, match=r"huge.csv:3: token counts must be 1 to 1,099,511,627,776"):
        read_lengths_csv(huge)


@pytest.mark.parametrize("args,message", [
    (["--rate", "5"], "give at least one latency target"),
    (["--ttft", "p90=1s"], "give the traffic as --rate"),
    (["--rate", "5", "--concurrency", "4", "--ttft", "p90=1s"], "one of them"),
    (["--rate", "5", "--ttft", "p90=soon"], "invalid --ttft target 'soon'"),
    (["--rate", "5", "--ttft", "q90=1s"], "is not p50"),
    (["--rate", "5", "--ttft", "p90=1s", "--gpu", "h20"], "no price for GPU 'h20'"),
    (["--rate", "5", "--ttft", "p90=1s", "--price-tier", "cheap"],
     "--price-tier must be any, neocloud or hyperscaler, not 'cheap'"),
    (["--rate", "5", "--ttft", "p90=1s", "--gpu", "gb300", "--price-tier", "neocloud"],
     "GPU 'gb300' has only a hyperscaler price, not a neocloud one: pass --price gb300=USD_PER_GPU_HOUR or "
     "--price-tier any"),
    (["--rate", "5", "--ttft", "p90=1s", "--price", "h100-sxm=free"], "is not a number"),
    (["--rate", "-1", "--ttft", "p90=1s"], "invalid --rate '-1'"),
    (["--rate", "5", "--ttft", "p90=1s", "--engine", "tgi"], "unknown engine 'tgi'"),
    (["--rate", "5", "--ttft", "p90=1s", "--points", "some"], "--points must be frontier or all"),
    (["--rate", "5", "--ttft", "p90=1s", "--gpu-memory-utilization", "0.8,0.9"], "give one --gpu-memory-utilization"),
    (["--rate", "5", "--ttft", "p90=1s", "--api-server-count", "0"], "--api-server-count must be 1 to 4096"),
    (["--rate", "5", "--ttft", "p90=99999999s"], "must be between 0 and"),
    (["--rate", "1e400", "--ttft", "p90=1s"], "--rate"),
    (["--rate", "5", "--ttft", "p90=1s", "--attention-dp", "128"], "--attention-dp"),
    (["--rate", "5", "--ttft", "p90=1s", "--attention-dp", "0"], "--attention-dp"),
    (["--rate", "5", "--ttft", "p90=1s", "--attention-dp", "8", "--ep", "off"], "needs --ep auto or on"),
    (["--rate", "5", "--ttft", "p90=1s", "--max-simulations", "0"], "--max-simulations must be 1 to 10,000, got 0"),
    (["--rate", "5", "--ttft", "p90=1s", "--max-gpus", "0"], "--max-gpus must be 1 to"),
    (["--rate", "5", "--ttft", "p90=1s", "--acceptance", "0.8"], "--acceptance and --draft-cost describe speculative"),
    (["--rate", "5", "--ttft", "p90=1s", "--kv-transfer-gbps", "25"], "the disaggregated pools' link: add --disagg"),
    (["--rate", "5", "--ttft", "p90=1s", "--sim-requests", "1000000", "--max-simulations", "3"],
     "could simulate 3,000,000 requests, past tfcalc's 2,000,000"),
    (["--rate", "5", "--ttft", "p90=1s", "--speculative", "1000"], "--speculative must be 0 to 64, got 1000"),
    (["--rate", "5", "--ttft", "p90=1s", "--speculative", "3", "--draft-cost", "inf"], "--draft-cost must be in [0"),
    (["--rate", "5", "--ttft", "p90=1s", "--speculative", "3", "--draft-cost", "-1"], "--draft-cost must be in [0"),
    (["--rate", "5", "--ttft", "p90=1s", "--length-dist", "lognormal", "--input-spread", "1e155"],
     "lognormal spread (coefficient of variation) must be in (0, 100]"),
    (["--rate", "5", "--ttft", "p90=1s", "--length-dist", "lognormal", "--output-spread", "nan"], "got nan"),
    (["--rate", "5", "--ttft", "p90=1s", "--input-spread", "2"], "--input-spread needs --length-dist"),
    # a spread of 0 is checked, never replaced by lognormal's default 0.5
    (["--rate", "5", "--ttft", "p90=1s", "--length-dist", "lognormal", "--input-spread", "0"],
     "lognormal spread (coefficient of variation) must be in (0, 100], got 0.0"),
    (["--rate", "5", "--ttft", "p90=1s", "--length-dist", "exponential", "--output-spread", "2"],
     "--output-spread needs --length-dist uniform or lognormal (the exponential distribution has no spread"),
    (["--ttft", "p90=1s", "--concurrency", "-4"], "invalid --concurrency '-4': must be positive"),
    (["--rate", "5", "--ttft", "p90=1s", "--model-path", " "], "--model-path is empty"),
    (["--rate", "5", "--ttft", "p90=1s", "--compute-efficiency", "1e-200"], "compute efficiency '1e-200'"),
    (["--rate", "5", "--ttft", "p90=1s", "--redundant-experts", "8"], "--redundant-experts needs an MoE model"),
    (["--rate", "5", "--ttft", "p90=1s", "--max-model-len", "1"], "does not fit --max-model-len of 1 tokens"),
    (["--rate", "5", "--ttft", "p90=1s", "--max-model-len", "1m"], "exceeds llama3-8b's context of 8,192"),
    (["--rate", "5", "--ttft", "p90=1s", "--input-len", "16k"], "does not fit llama3-8b's context of 8,192"),
    (["--rate", "5", "--ttft", "p90=1s", "-tp", "3"], "fits the limits (max GPUs 64, 8 per node): tp 3 does not "
                                                     "divide the 32 attention heads"),
])
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = run("capacity", "-p", "llama3-8b", *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], result.output


def test_rate_overrides_reach_the_worker_processes(tmp_path: Path) -> None:
    """--compute-efficiency and --calibration are handed to the search's worker processes (picklable), so a
    search on two workers answers as one does."""
    base = [*SMALL, "--no-simulate", "-f", "json", "--compute-efficiency", "0.5"]
    one, two = run(*base, "--workers", "1"), run(*base, "--workers", "2")
    assert one.exit_code == 0 and two.exit_code == 0, two.output
    assert json.loads(one.stdout) == json.loads(two.stdout)
    calibration = tmp_path / "cal.json"
    calibration.write_text(json.dumps({"compute_efficiency": {"prefill": 0.6, "decode": 0.5},
                                       "bandwidth_efficiency": {"prefill": 0.8, "decode": 0.7}}))
    result = run(*SMALL, "--no-simulate", "--workers", "2", "--calibration", str(calibration))
    assert result.exit_code == 0, result.output


def test_max_simulations_reaches_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """--max-simulations caps the simulation check's walk (verified_choice, tested in tests/calc/test_capacity.py)."""
    from tfcalc.calc import capacity

    seen, walk = [], capacity.verified_choice

    def recorded(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.append(kwargs["max_simulations"])
        return walk(*args, **kwargs)

    monkeypatch.setattr(capacity, "verified_choice", recorded)
    assert run(*SMALL, "--workers", "1", "--max-simulations", "3").exit_code == 0
    assert run(*SMALL, "--workers", "1").exit_code == 0
    assert seen == [3, 12]


def test_a_layout_engines_cannot_load_is_one_line() -> None:
    result = run("capacity", "-p", "qwen3-235b-a22b", "-w", "fp8_block", "--tp", "8", "--ep", "off", "--rate", "5",
                 "--ttft", "p90=1s")
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "each expert of qwen3-235b-a22b split 8 ways is 192 wide, not a whole number of fp8_block's" in lines[0]


def test_impossible_targets_exit_1_with_the_closest() -> None:
    result = run("capacity", "-p", "llama3-8b", "--gpu", "l40s", "--tp", "1", "--max-num-seqs", "64",
                 "--max-num-batched-tokens", "2048", "--rate", "5", "--ttft", "p50=1ms", "--no-simulate")
    assert result.exit_code == 1
    assert "no configuration of llama3-8b meets the targets" in result.output


def test_parsers() -> None:
    assert parse_duration("500ms", "x") == pytest.approx(0.5)
    assert parse_duration("2", "x") == 2.0
    assert parse_duration("800us", "x") == pytest.approx(8e-4)
    (a, b) = parse_targets(["p50=200ms,p99.9=2s"], "ttft")
    assert (a.percentile, a.seconds, b.percentile, b.seconds) == (50, 0.2, 99.9, 2.0)
    assert parse_targets(["mean=40ms"], "tpot")[0].percentile == 0
    for twice in (["p90=1s", "p90=2s"], ["p90=1s,P90=1s"], ["mean=1s,avg=2s"]):
        with pytest.raises(UsageError, match="given twice"):
            parse_targets(twice, "ttft")
    assert len(parse_targets(["p90=1s,p99=2s"], "ttft")) == 2


@pytest.mark.parametrize(("price", "message"), [
    ("h100sxm=0.5", "--price: unknown gpu preset 'h100sxm'"),   # a typo was ignored when --gpu was not given
    ("h100-sxm=0.5,H100-SXM=0.7", "--price for 'h100-sxm' is given twice (H100-SXM)"),
])
def test_every_price_names_a_gpu_once(price: str, message: str) -> None:
    result = run("capacity", "-p", "llama3-8b", "--price", price, "--rate", "1", "--tpot", "p90=100ms",
                 "--no-simulate")
    assert result.exit_code == 2 and message in result.output


def test_a_price_by_another_spelling_of_the_preset_applies() -> None:
    result = run("capacity", "-p", "llama3-8b", "--gpu", "h100-sxm", "--price", "H100-SXM=0.5", "--tp", "1",
                 "--max-num-seqs", "64", "--rate", "1", "--tpot", "p90=100ms", "--no-simulate", "-f", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["price_per_gpu_hour"] == 0.5   # the preset's own price is not 0.5


FAST = ["--gpu", "h100-sxm", "--tp", "1", "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--rate", "4",
        "--ttft", "p90=1s", "--no-simulate"]


def test_the_checkpoint_comes_from_what_the_user_named(tmp_path: Path) -> None:
    """A preset by name: its hf_repo; by one of its repository ids: that id; --model-path: the path (quoted for
    the shell); a config.json: its folder when the weights are beside it, else its _name_or_path, else a
    placeholder and a note saying to pass --model-path. The JSON summary carries the chosen engine's command."""
    def launch(*args: str) -> str:
        result = run("capacity", *args, *FAST)
        assert result.exit_code == 0, result.output
        return next(line for line in result.stdout.splitlines() if line.startswith("vLLM:"))

    assert launch("-p", "llama3.1-8b").endswith("vllm serve meta-llama/Llama-3.1-8B-Instruct \\")
    assert launch("-p", "meta-llama/llama-3.1-8b").endswith("vllm serve meta-llama/Llama-3.1-8B \\")
    assert launch("-p", "llama3.1-8b", "--model-path", "/models/my llama").endswith("vllm serve '/models/my llama' \\")
    fixture = json.loads((Path(__file__).parents[1] / "fixtures/hf_configs/llama3.1-8b.json").read_text())
    named, bare, weights = tmp_path / "named", tmp_path / "bare", tmp_path / "weights"
    for folder, extra in ((named, {"_name_or_path": "acme/llama-ft"}), (bare, {}),
                          (weights, {"_name_or_path": "acme/llama-ft"})):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**fixture, **extra}))
    (weights / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert launch("-c", str(named / "config.json")).endswith("vllm serve acme/llama-ft \\")
    assert launch("-c", str(weights / "config.json")).endswith(f"vllm serve {weights} \\")
    result = run("capacity", "-c", str(bare / "config.json"), *FAST)
    assert result.exit_code == 0, result.output
    words = " ".join(result.stdout.split())
    assert "vllm serve MODEL_PATH \\" in result.stdout and "pass --model-path: bare names no checkpoint" in words
    chosen = json.loads(run("capacity", "-p", "llama3.1-8b", *FAST, "-f", "json").stdout)[0]
    assert chosen["role"] == "chosen"
    assert chosen["launch_command"].startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 1")


def test_columns_and_wide_select_the_same_keys_as_csv() -> None:
    """The table's rows are the CSV's summary rows: --columns names any of their keys (a target's latency too),
    in the table and in CSV alike; --wide shows every key."""
    args = ["capacity", "-p", "llama3-8b", *FAST, "--columns", "gpu,layout,cost_per_hour,operating_ttft_p90_s"]
    table = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert table.exit_code == 0, table.output
    header = table.stdout.splitlines()[1].split()
    assert header[:3] == ["GPU", "layout", "$"] and "Pareto frontier" not in table.stdout
    csv_out = run(*args, "-f", "csv")
    assert csv_out.stdout.splitlines()[0] == "gpu,layout,cost_per_hour,operating_ttft_p90_s"
    wide = runner.invoke(app, ["capacity", "-p", "llama3-8b", *FAST, "--wide"], env={"COLUMNS": "200"})
    assert wide.exit_code == 0 and "launch command" in wide.stdout and "KV dtype" in wide.stdout
    words = " ".join(wide.stdout.split())  # the chosen plan's costs, also without the simulation
    assert "$nan" not in words and "per million input and $0.8" in words


def test_routing_reaches_the_step_model() -> None:
    """--routing as in estimate: under aiconfigurator's power-law workload a 16-sequence Qwen3-30B-A3B decode step
    reads ~49 of 128 experts per layer instead of ~82, so the same plan decodes faster."""
    def tpot(routing: str) -> float:
        result = run("capacity", "-p", "qwen3-30b-a3b", "--gpu", "h200", "--tp", "1", "--max-num-seqs", "16",
                     "--max-num-batched-tokens", "2048", "--concurrency", "16", "--input-len", "1000",
                     "--output-len", "200", "--tpot", "p90=100ms", "--no-simulate", "--ep", "off", "-w", "bf16",
                     "--kv-dtype", "bf16", "--points", "all", "-f", "json", "--routing", routing)
        assert result.exit_code == 0, result.output
        (value,) = [r["value"] for r in json.loads(result.stdout) if r["metric"] == "operating_tpot_p90_s"]
        return value

    uniform, power_law = tpot("uniform"), tpot("power-law:1.2")
    assert power_law < 0.85 * uniform
    bad = run("capacity", "-p", "llama3-8b", "--rate", "5", "--ttft", "p90=1s", "--routing", "zipf")
    assert bad.exit_code == 2 and "invalid routing 'zipf'" in bad.output


def test_quantized_weights_of_a_16_bit_preset_tell_trtllm_to_serve_a_quantized_checkpoint() -> None:
    """vLLM and SGLang quantise online (--quantization fp8); trtllm-serve cannot, so its command says which
    checkpoint to serve instead of silently serving the 16-bit one; bf16 plans carry no such line."""
    fp8 = run(*SMALL, "--weights-dtype", "fp8")
    assert fp8.exit_code == 0, fp8.output
    assert "--quantization fp8" in fp8.stdout
    assert "(serve a pre-quantized fp8_e4m3 checkpoint, e.g. ModelOpt's:" in fp8.stdout
    assert all(len(line) <= 80 for line in fp8.stdout.splitlines() if "pre-quantized" in line)
    bf16 = run(*SMALL, "--weights-dtype", "bf16")
    assert bf16.exit_code == 0, bf16.output
    assert "pre-quantized" not in bf16.stdout


def test_bitsandbytes_weights_quantise_in_flight_and_trtllm_gets_no_command() -> None:
    """nf4 weights of a 16-bit checkpoint: vLLM and SGLang quantise them at load (--quantization bitsandbytes);
    TensorRT-LLM serves no bitsandbytes format, so its command line says so, and searching it is an error."""
    nf4 = run(*SMALL, "--weights-dtype", "nf4", "--no-simulate")
    assert nf4.exit_code == 0, nf4.output
    assert nf4.stdout.count("--quantization bitsandbytes") == 2
    assert "TRT-LLM: (trtllm does not serve nf4 weights)" in nf4.stdout
    only = run(*SMALL, "--weights-dtype", "nf4", "--engine", "trtllm")
    assert only.exit_code == 2 and only.output.strip() == "error: trtllm does not serve nf4 weights"


def test_each_engine_searches_a_float32_checkpoint_in_the_format_it_serves() -> None:
    """SmolLM 1.7B ships float32: vLLM serves it in bf16 (its weights and default cache), TensorRT-LLM as it is
    (no downcast in its preset); searched together, each engine is priced only in its own formats (and fp8). Before,
    both took the first engine's bf16."""
    config = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs" / "smollm-1.7b.json"
    result = run("capacity", "--config", str(config), "--gpu", "l40s", "--tp", "1", "--rate", "5", "--input-len",
                 "1k", "--output-len", "200", "--ttft", "p90=1s", "--no-simulate", "-e", "vllm,trtllm",
                 "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--points", "all", "-f", "json")
    assert result.exit_code == 0, result.output
    formats: dict[str, set[tuple[str, str]]] = {}
    for row in json.loads(result.stdout):
        formats.setdefault(row["engine"].split()[0], set()).add((row["weights_dtype"], row["kv_dtype"]))
    fp8 = "fp8_e4m3"
    assert formats == {"vllm": {(w, k) for w in ("bf16", fp8) for k in ("bf16", fp8)},
                       "trtllm": {(w, k) for w in ("fp32", fp8) for k in ("fp32", fp8)}}


def test_data_parallel_attention_plan_and_its_launch_flags() -> None:
    """--attention-dp: DeepSeek-V3 at 30 req/s on H200s under SGLang (256 sequences and 2,048-token chunks a rank)
    takes two tp-4 ranks sharing the experts (40 GPUs, which its simulation confirms, against 48 at tp 8; eight tp-1
    ranks would need 64: every rank's 512-token prefill steps hold the group's decodes), sized in whole groups, and
    each engine's command starts it as one instance: vLLM --data-parallel-size, SGLang --tp 8 --dp 2
    --enable-dp-attention (its request cap counts every rank), TensorRT-LLM enable_attention_dp."""
    base = ["capacity", "-p", "deepseek-v3", "--gpu", "h200", "--engine", "sglang", "--rate", "30", "--input-len",
            "2k", "--output-len", "500", "--length-dist", "fixed", "--ttft", "p90=3s", "--tpot", "p90=80ms",
            "--weights-dtype", "fp8_block", "--kv-dtype", "fp8", "--max-num-seqs", "256",
            "--max-num-batched-tokens", "2048", "--no-simulate"]
    wide = run(*base, "--attention-dp", "1,2")
    plain = run(*base)
    assert wide.exit_code == 0 and plain.exit_code == 0, wide.output + plain.output
    text = " ".join(wide.stdout.split())
    assert "5 group(s) of 2 data-parallel rank(s) x tp4·dp2·ep8 = 40" in text and "instance(s) of 8 GPUs" in text
    assert "--tensor-parallel-size 4 \\ --data-parallel-size 2" in text and "--enable-expert-parallel" in text
    assert "--tp 8 \\ --dp 2 \\ --enable-dp-attention" in text and "--max-running-requests 512" in text
    assert "--ep-size 8 \\ --moe-a2a-backend deepep" in text and "--nnodes" not in text  # priced as DeepEP
    assert "enable_attention_dp: true" in text and "--tp_size 8" in text
    gpus = [json.loads(run(*args, "-f", "json").stdout)[0]["num_gpus"] for args in (base + ["--attention-dp", "1,2"],
                                                                                  base)]
    assert gpus == [40, 48]
    narrow = [{"256": "128", "2048": "512"}.get(arg, arg) for arg in base]
    eight = json.loads(run(*narrow, "--attention-dp", "8", "--tp", "1", "--max-gpus", "128", "-f", "json").stdout)[0]
    assert eight["dp"] == 8 and eight["num_gpus"] == 64 and eight["max_num_seqs"] == 128


def test_data_parallel_attention_across_nodes_and_its_launch_flags() -> None:
    """--attention-dp beyond a node: sixteen tp-1 ranks of DeepSeek-V3 on H200s span two 8-GPU nodes, their
    all-to-all over InfiniBand; each engine's head-node command says so (SGLang --nnodes / --node-rank with DeepEP,
    vLLM --data-parallel-size-local 8 with its DeepEP low-latency backend), and the sentence says where to run it."""
    result = run("capacity", "-p", "deepseek-v3", "--gpu", "h200", "--engine", "sglang", "--rate", "10",
                 "--input-len", "2k", "--output-len", "500", "--length-dist", "fixed", "--ttft", "p90=10s",
                 "--tpot", "p90=1s", "--weights-dtype", "fp8_block", "--kv-dtype", "fp8", "--max-num-seqs", "128",
                 "--max-num-batched-tokens", "2048", "--no-simulate", "--attention-dp", "16", "--tp", "1",
                 "--ep", "on", "--max-gpus", "64")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "tp1·dp16·ep16" in text and "each across 2 nodes" in text
    assert "--moe-a2a-backend deepep" in text
    assert "--nnodes 2 \\ --node-rank 0 \\ --dist-init-addr HEAD_NODE_IP:5000" in text
    assert "--data-parallel-size 16 \\ --data-parallel-size-local 8" in text
    assert "--all2all-backend deepep_low_latency" in text
    assert all(len(line) <= 100 for line in result.stdout.splitlines())


def test_redundant_experts_plan_and_launch_flags() -> None:
    """--redundant-experts 32: DeepSeek-V3 on a GB200 NVL72 may run 72 ranks (288 expert slots over ep 72); the
    rows say it, and each engine's command starts EPLB with the replicas (SGLang --enable-eplb
    --ep-num-redundant-experts, vLLM --enable-eplb --eplb-config, TensorRT-LLM's load balancer of 288 slots)."""
    base = ["capacity", "-p", "deepseek-v3", "--gpu", "gb200", "--price", "gb200=6", "--engine", "sglang", "--rate",
            "30", "--input-len", "2k", "--output-len", "500", "--ttft", "p90=5s", "--tpot", "p90=100ms",
            "--weights-dtype", "fp8_block", "--kv-dtype", "fp8", "--no-simulate", "--attention-dp", "72", "--tp", "1",
            "--ep", "on", "--max-gpus", "144", "--max-num-seqs", "128", "--max-num-batched-tokens", "512"]
    without = run(*base)
    assert without.exit_code != 0 and "dp72" not in without.output   # 256 experts: ep 72 is no layout
    result = run(*base, "--redundant-experts", "32")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "tp1·dp72·ep72+32r" in text
    assert "--enable-eplb \\ --ep-num-redundant-experts 32" in text
    assert "--enable-eplb \\ --eplb-config '{\"num_redundant_experts\": 32}'" in text
    assert "moe_config: {load_balancer: {num_slots: 288}}" in text
    assert "--nnodes 18" in text and "--data-parallel-size-local 4" in text   # 72 ranks on compute trays of 4
    assert "each across 18 nodes" in text
    rows = json.loads(run(*base, "--redundant-experts", "32", "-f", "json").stdout)
    assert rows and all(row["redundant_experts"] == 32 for row in rows)


def _wide_ep(engine: str, attention_dp: str) -> list[str]:
    """DeepSeek-V3 on H100s at 50 req/s, disaggregated, data-parallel attention ranks over expert parallelism."""
    return ["capacity", "-p", "deepseek-v3", "--gpu", "h100-sxm", "--engine", engine, "--rate", "50",
            "--input-len", "2k", "--output-len", "500", "--ttft", "p90=5s", "--tpot", "p90=100ms",
            "--weights-dtype", "fp8_block", "--kv-dtype", "fp8", "--no-simulate", "--attention-dp", attention_dp,
            "--tp", "1", "--ep", "on", "--max-gpus", "128", "--disaggregated"]


def test_disaggregated_wide_ep_pools_in_words() -> None:
    """A disaggregated plan of data-parallel pools says both pools' groups and layouts, and where to run them."""
    import re

    result = run(*_wide_ep("sglang", "8,16,32"))
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    pool = r"\d+ (prefill|decode) group\(s\) of \d+ data-parallel rank\(s\) at tp1·dp\d+·ep\d+"
    assert re.search(rf"cheapest plan for deepseek-v3 at 50 req/s: \d+ x h100-sxm: {pool} \+ {pool}", text)
    assert re.search(r"launch: run \d+ prefill group\(s\) of \d+ data-parallel rank\(s\) at tp1·dp\d+·ep\d+ "
                     r"\(SGLang --disaggregation-mode prefill\) and \d+ decode group\(s\)", text)


def test_vllm_034_extensible_cache_off_reaches_the_launch_line() -> None:
    """--no-enable-extensible-kv-cache plans vLLM 0.34+ without its extensible cache and its vllm serve line says
    so; a disaggregated vLLM 0.34+ plan (NixlConnector) warns that hosts without an IMEX channel run it off."""
    small = [*ONE_H100, "--engine", "vllm@0.34"]
    off, on = run(*small, "--no-enable-extensible-kv-cache"), run(*small)
    assert off.exit_code == 0 and on.exit_code == 0, off.output + on.output
    assert "--no-enable-extensible-kv-cache" in off.stdout and "extensible" not in on.stdout
    split = run(*_wide_ep("vllm@0.34", "8,16"))
    assert split.exit_code == 0, split.output
    text = " ".join(split.stdout.split())
    assert "NixlConnector" in text
    assert ("vllm 0.34+ keeps its extensible KV cache off under NixlConnector on hosts without an IMEX channel: "
            "there, plan with --no-enable-extensible-kv-cache") in text


def test_a_remote_code_checkpoint_launches_with_trust_remote_code() -> None:
    """Kimi K2's config.json (model_type kimi_k2, its own code in auto_map; read as DeepSeek-V3 by its architecture)
    plans like any DeepSeek-V3-shaped model, and every engine's command loads its code: vLLM and SGLang
    --trust-remote-code, trtllm-serve --trust_remote_code; a built-in model type's commands do not."""
    kimi = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs" / "kimi-k2.json"
    base = ["capacity", "--gpu", "b200", "--tp", "8", "--rate", "2", "--input-len", "2k", "--output-len", "300",
            "--ttft", "p90=3s", "--tpot", "p90=80ms", "--weights-dtype", "fp8_block", "--max-num-seqs", "64",
            "--max-num-batched-tokens", "4096", "--no-simulate"]
    result = run(*base, "-c", str(kimi))
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "vllm serve" in text and text.count("--trust-remote-code") == 2 and "--trust_remote_code" in text
    plain = run(*base, "-p", "deepseek-v3")
    assert plain.exit_code == 0, plain.output
    assert "trust" not in plain.stdout


def test_kimi_k25_int4_experts_launch_on_vllm_and_sglang_with_their_code_and_not_on_trtllm() -> None:
    """Kimi K2.5 (preset and config.json alike): its native int4 experts are compressed-tensors groups TensorRT-LLM
    does not load, so its line says so; vLLM and SGLang serve the checkpoint as it is, with its own code."""
    base = ["capacity", "--gpu", "h200", "--tp", "8", "--rate", "1", "--input-len", "2k", "--output-len", "300",
            "--ttft", "p90=5s", "--tpot", "p90=80ms", "--max-num-seqs", "32", "--max-num-batched-tokens", "4096",
            "--no-simulate"]
    result = run(*base, "-p", "kimi-k2.5")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "TRT-LLM: (trtllm does not serve int4-g32-sym weights)" in text
    assert "vllm serve moonshotai/Kimi-K2.5" in text and text.count("--trust-remote-code") == 2
    only = run(*base, "-p", "kimi-k2.5", "--engine", "trtllm")
    assert only.exit_code == 2 and only.output.strip() == "error: trtllm does not serve int4-g32-sym weights"


def test_mamba2_plan_launches_vllm_with_its_fp32_states() -> None:
    """Nemotron 3 Nano's plan sizes its SSM states in fp32 (the config's mamba_ssm_cache_dtype): the vLLM line asks
    for them (vLLM's auto would keep the model's bf16)."""
    result = run("capacity", "-p", "nemotron-3-nano-30b-a3b", "--gpu", "h100-sxm", "--tp", "1", "--max-num-seqs",
                 "64", "--max-num-batched-tokens", "2048", "--rate", "2", "--input-len", "1000", "--output-len",
                 "200", "--ttft", "p90=2s", "--tpot", "p90=60ms", "--sim-requests", "200")
    assert result.exit_code == 0, result.output
    assert "--mamba-ssm-cache-dtype float32" in result.stdout
    small = run(*SMALL)
    assert "--mamba-ssm-cache-dtype" not in small.stdout


@pytest.mark.parametrize("terminal", [False, True])
def test_search_progress_without_a_terminal_is_a_line_every_ten_seconds(monkeypatch, capsys, terminal: bool) -> None:
    """A CI log or a pipe gets plain lines (none in the first 10 s, then one per 10 s); a terminal gets one status
    line that each update rewrites, from the first second, cleared at the end. The simulation check reports through
    the same clock."""
    import tfcalc.cli.capacity as capacity_cli
    import tfcalc.output.progress as progress

    clock = iter([100.0, 100.5, 105.0, 110.5, 112.0, 121.0, 122.0, 131.5])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    update, simulating, close = capacity_cli._progress(2000)
    for done in (10, 100, 300, 400, 900):
        update(done)
    from tfcalc.calc.capacity import Candidate, Evaluation

    def plan(gpus: int):  # noqa: ANN202 - an Evaluation as the walk hands it over
        candidate = Candidate(engine="vllm", gpu="h100-sxm", tp=2, pp=1, ep=1, weights="bf16", kv_dtype="bf16",
                              max_num_seqs=64, chunk=2048)
        return Evaluation(candidate=candidate, fits=True, feasible=True, reason="", price_per_gpu_hour=1.0,
                          replicas=gpus // 2, num_gpus=gpus)

    simulating(1, plan(4))
    simulating(2, plan(6))
    close()
    err = capsys.readouterr().err
    if terminal:
        assert err.count("\r\x1b[K") == 7 and "300 / 2,000 configurations, 10.5 s" in err and err.endswith("\x1b[K")
        assert "checking by simulation: 2 (6 x h100-sxm tp2), 31.5 s" in err
    else:
        assert err.splitlines() == ["searching: 300 / 2,000 configurations, 10.5 s",
                                    "searching: 900 / 2,000 configurations, 21.0 s",
                                    "checking by simulation: 2 (6 x h100-sxm tp2), 31.5 s"]


def test_a_forced_model_runner_reaches_the_launch_line() -> None:
    """--model-runner V2 on vLLM 0.25 (whose Qwen3-30B-A3B, an MoE model, runs on V1 by default) plans with the V2
    runner and launches with VLLM_USE_V2_MODEL_RUNNER=1; without it, the line sets nothing."""
    small = ["capacity", "-p", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--tp", "1", "--max-num-seqs", "64",
             "--max-num-batched-tokens", "2048", "--rate", "2", "--input-len", "1000", "--output-len", "200",
             "--ttft", "p90=1s", "--tpot", "p90=60ms", "--no-simulate", "--engine", "vllm@0.25"]
    forced, chosen = run(*small, "--model-runner", "V2"), run(*small)
    assert forced.exit_code == 0 and chosen.exit_code == 0, forced.output + chosen.output
    assert "VLLM_USE_V2_MODEL_RUNNER=1 vllm serve Qwen/Qwen3-30B-A3B" in forced.stdout
    assert "VLLM_USE_V2_MODEL_RUNNER" not in chosen.stdout and "vllm serve Qwen/Qwen3-30B-A3B" in chosen.stdout
    bad = run(*small, "--model-runner", "V9")
    assert bad.exit_code != 0 and "must be V1 or V2" in bad.output


def test_a_set_kv_cache_reaches_the_vllm_line_and_nothing_fitting_says_why() -> None:
    """--kv-cache-memory-bytes goes on the vllm serve line (in bytes) and not on SGLang's; a size no GPU holds beside
    the rest makes every configuration fail, and the notes give the reason of the roomiest; an engine list without
    vLLM 0.11+ is a one-line error."""
    result = run(*ONE_H100, "--kv-cache-memory", "20g")
    assert result.exit_code == 0, result.output
    vllm_line = result.stdout[result.stdout.index("vllm serve"):result.stdout.index("SGLang:")]
    assert f"--kv-cache-memory-bytes {20 << 30}" in vllm_line
    assert "kv-cache-memory" not in result.stdout[result.stdout.index("SGLang:"):]
    over = run(*ONE_H100, "--kv-cache-memory", "75g", "--engine", "vllm")
    text = " ".join(over.stdout.split())
    assert over.exit_code != 0 and "0 fit" in text and "none fits, the roomiest" in text
    assert "the set KV cache of 75.00 GiB per GPU and the rest exceed the GPU by" in text
    bad = run(*ONE_H100, "--kv-cache-memory", "20g", "--engine", "sglang")
    assert bad.exit_code != 0 and "no engine asked takes it" in bad.output and "Traceback" not in bad.output


def test_a_cheaper_gpu_that_never_fits_is_explained_by_its_roomiest_layout() -> None:
    """Llama 3 70B, RTX 4090s beside an H100: the plan is 4 x 4090 (tp4, fp8); every cheaper 4090 layout is short of
    memory, and the line names the one short by least (tp2, fp8) -- not the first searched (tp1, bf16). (At 0.5
    req/s the 4-GPU PCIe ring's 5 GB/s, pcie4's nccl_efficiency_by_gpus, needs two tp-4 replicas: the H100 wins.)"""
    result = run("capacity", "-p", "llama3-70b", "--gpu", "h100-sxm,rtx4090", "--rate", "0.3", "--tpot", "p90=80ms",
                 "--max-num-seqs", "16", "--max-num-batched-tokens", "2048", "--no-simulate", "--format", "table")
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("cheaper rtx4090"))
    assert "weights fp8_e4m3" in line and "does not fit" in line and "tp1," not in line


def test_enumerated_options_take_any_case() -> None:
    """--points ALL, --length-dist Fixed, --ep AUTO, --format CSV read as their lower-case names (the same rows);
    a value that is no choice is still a usage error."""
    lower = run(*ONE_H100, "--no-simulate", "--points", "all", "--length-dist", "fixed", "--ep", "auto", "-f", "csv")
    upper = run(*ONE_H100, "--no-simulate", "--points", "ALL", "--length-dist", "Fixed", "--ep", "AUTO", "-f", "CSV")
    assert lower.exit_code == 0 and upper.exit_code == 0, lower.output + upper.output
    assert upper.stdout == lower.stdout and len(lower.stdout.splitlines()) > 10
    for flag, value, message in (("--points", "Some", "--points must be frontier or all, got 'some'"),
                                 ("--ep", "Maybe", "--ep must be auto, on or off, got 'maybe'")):
        bad = run(*ONE_H100, "--no-simulate", flag, value)
        assert bad.exit_code == 2 and bad.output.strip() == f"error: {message}"
