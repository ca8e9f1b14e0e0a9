"""Issue 11, classes 3 to 7: hostile inputs never produce a traceback, a hang or a silently wrong number.

One test (or one small family) per class, with hypothesis where it fits. Every CLI run happens under a time
limit (SIGALRM): a hang fails the test instead of stalling the suite. Class 1 (output paths) is in
tests/output/test_files.py; docs/reliability.md maps each promise to its test.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tfcalc.calc.kv_cache import kv_cache_exact_bytes, tokens_held
from tfcalc.cli import app
from tfcalc.dtypes import get_dtype
from tfcalc.errors import SpecError, UsageError
from tfcalc.spec.model import INT_LIMITS
from tfcalc.spec.presets import load_gpu, load_model, load_preset_document, preset_path
from tfcalc.units import parse_size

runner = CliRunner()
FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
TIME_LIMIT_S = 20  # a hang detector, not a speed target: each run here answers in well under a second


@contextlib.contextmanager
def time_limit(seconds: float = TIME_LIMIT_S) -> Iterator[None]:
    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def invoke(args: list[str]) -> Any:
    with time_limit():
        return runner.invoke(app, args)


def assert_clean_ending(result: Any, codes: tuple[int, ...] = (0, 1, 2)) -> None:
    """Exit 0, 1 or 2; no traceback, no internal error, no escape sequence; a failure says one error line."""
    output = result.output
    assert result.exit_code in codes, output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in output and "internal error" not in output, output
    assert "\x1b" not in output and "\x9b" not in output, repr(output)
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == (0 if result.exit_code == 0 else 1), output


# --- hostile values for the mutation tests --------------------------------------------------------------------
HOSTILE_SCALARS = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 1, 2**31, 2**53 + 1, 10**400, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.sampled_from(["no", "yes", "1e3", "all", "even", "relu", "", "\x1b]0;pwned\x07", "\u202eevil", "x" * 300,
                     "../../etc/passwd", "bf16", "fp8", "yarn", "llama3"]),
    st.text(max_size=12),
)
HOSTILE_VALUES = st.one_of(HOSTILE_SCALARS, st.lists(HOSTILE_SCALARS, max_size=4),
                           st.dictionaries(st.text(max_size=8), HOSTILE_SCALARS, max_size=3))


def mutations(keys: list[str]) -> st.SearchStrategy[list[tuple[str, str, Any]]]:
    """1-4 edits: set a (possibly nested, possibly new) key to a hostile value, or delete it."""
    key = st.one_of(st.sampled_from(keys), st.text(min_size=1, max_size=10))
    edit = st.tuples(st.sampled_from(["set", "set", "delete"]), key, HOSTILE_VALUES)
    return st.lists(edit, min_size=1, max_size=4)


def apply(document: dict[str, Any], edits: list[tuple[str, str, Any]]) -> dict[str, Any]:
    document = copy.deepcopy(document)
    for action, key, value in edits:
        *parents, leaf = key.split(".")
        target = document
        for parent in parents:
            child = target.get(parent)
            if not isinstance(child, dict):
                child = target[parent] = {}
            target = child
        if action == "delete":
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return document


def text_edits() -> st.SearchStrategy[tuple[str, int, str]]:
    """A raw text edit after serialising: none, truncate, insert a fragment, or append a duplicate key."""
    fragments = st.sampled_from(["&a ", "*a", "[", "{", "}", "\t", ": :", "\x00", "!!python/object:os.system ",
                                 "\nnum_layers: 2\n", "<<: *a\n", "'", '"', "\\u0000", "NaN", "1e999"])
    return st.tuples(st.sampled_from(["none", "none", "truncate", "insert", "duplicate"]), st.integers(0, 10**6),
                     fragments)


def edit_text(text: str, edit: tuple[str, int, str]) -> str:
    kind, where, fragment = edit
    at = where % (len(text) + 1)
    if kind == "truncate":
        return text[:at]
    if kind == "insert":
        return text[:at] + fragment + text[at:]
    if kind == "duplicate":
        lines = text.splitlines(keepends=True)
        return text + (lines[where % len(lines)] if lines else "")
    return text


PRESET_DOCS = {name: load_preset_document("model", name) for name in ("llama3-8b", "deepseek-v3", "gpt-oss-20b")}
PRESET_KEYS = sorted({key for doc in PRESET_DOCS.values() for key in doc} | {
    "moe.router_bias", "moe.num_experts", "moe.dense_layers", "moe.first_k_dense", "mla.kv_lora_rank",
    "rope_scaling.factor", "rope_scaling.rope_type", "sliding_window_layers", "name", "activation", "norm_kind"})


# --- classes 3, 4, 5: hostile model YAML, config.json and GPU YAML ------------------------------------------
@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(base=st.sampled_from(sorted(PRESET_DOCS)), edits=mutations(PRESET_KEYS), raw=text_edits(),
       command=st.sampled_from(["kv-cache", "params", "memory"]), overwrite=st.booleans(),
       fmt=st.sampled_from(["table", "json"]))
def test_mutated_model_yaml_never_crashes_hangs_or_changes_the_file(
        tmp_path: Path, base: str, edits: list[tuple[str, str, Any]], raw: tuple[str, int, str], command: str,
        overwrite: bool, fmt: str) -> None:
    path = tmp_path / "model.yaml"
    text = edit_text(yaml.safe_dump(apply(PRESET_DOCS[base], edits), allow_unicode=True), raw)
    path.write_text(text, encoding="utf-8")
    before = path.read_bytes()
    args = [command, "-p", str(path), "-f", fmt] + ([] if command == "params" else ["--context", "4k"])
    result = invoke(args + (["-o", str(path)] if overwrite else []))
    assert_clean_ending(result)
    if overwrite:
        assert result.exit_code == 2 and "overwrite an input" in result.output, result.output
    assert path.read_bytes() == before


HF_DOCS = {name: json.loads((FIXTURES / f"{name}.json").read_text())
           for name in ("llama3-8b", "deepseek-v3", "gpt-oss-20b", "gemma2-9b", "synthetic-qwen2-moe-sparse-step")}
HF_KEYS = sorted({key for doc in HF_DOCS.values() for key in doc} | {"rope_scaling.factor", "rope_scaling.rope_type"} |
                 {f"quantization_config.{k}" for k in ("quant_method", "bits", "group_size", "weight_block_size",
                                                       "modules_to_not_convert", "ignore", "config_groups",
                                                       "quant_algo", "lm_head")})


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(base=st.sampled_from(sorted(HF_DOCS)), edits=mutations(HF_KEYS), raw=text_edits(),
       command=st.sampled_from(["kv-cache", "params", "memory"]))
def test_mutated_config_json_never_crashes_hangs_or_changes_the_file(
        tmp_path: Path, base: str, edits: list[tuple[str, str, Any]], raw: tuple[str, int, str], command: str) -> None:
    path = tmp_path / "config.json"
    text = edit_text(json.dumps(apply(HF_DOCS[base], edits), indent=1), raw)
    path.write_text(text, encoding="utf-8")
    before = path.read_bytes()
    assert_clean_ending(invoke([command, "-c", str(path), "-f", "json"]))
    assert path.read_bytes() == before


GPU_DOC = load_preset_document("gpu", "h100-sxm")


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=mutations(sorted(GPU_DOC) + ["dense_tflops.bf16", "dense_tflops.fp9", "memory_gb", "name"]),
       raw=text_edits())
def test_mutated_gpu_yaml_is_a_valid_gpu_or_one_line_error(tmp_path: Path, edits: list[tuple[str, str, Any]],
                                                           raw: tuple[str, int, str]) -> None:
    import math

    path = tmp_path / "gpu.yaml"
    path.write_text(edit_text(yaml.safe_dump(apply(GPU_DOC, edits), allow_unicode=True), raw), encoding="utf-8")
    try:
        with time_limit():
            gpu = load_gpu(str(path))
    except (SpecError, UsageError) as exc:
        assert "\n" not in str(exc)
        return
    numbers = [gpu.memory_bytes, gpu.hbm_bandwidth_bytes_per_s, gpu.interconnect_bandwidth_bytes_per_s,
               *gpu.dense_flops_per_s.values()]
    assert all(math.isfinite(n) and n > 0 for n in numbers) and isinstance(gpu.name, str)


# --- class 3: bounded time and memory ---------------------------------------------------------------------------
BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))


@pytest.mark.parametrize("content, message", [
    (BILLION_LAUGHS, "expands to more than 100,000 values"),
    ("a: &a [*a]\n", "recursive YAML alias"),
    ("num_layers: 1\n" + "x: [1, 2, 3]\n" * 100_000, "larger than 1 MiB"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "malformed YAML"),
    ("a: " + "[" * 150 + "]" * 150 + "\n", "nested deeper than 100 levels"),
    ("num_layers: 100000000000000\n", "field 'num_layers' must be at most 10,000"),
    ("num_layers: " + "9" * 401 + "\n", "field 'num_layers' must be at most 10,000"),
    ("num_layers: " + "9" * 5000 + "\n", "a number with more than 4,300 digits"),
    ("num_layers: 8\nmoe: {first_k_dense: 100000000000000}\n", "field 'moe.first_k_dense' must be at most 8"),
])
def test_oversized_inputs_are_refused_quickly_naming_the_limit(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(content)
    started = time.monotonic()
    result = invoke(["kv-cache", "-p", str(path)])
    assert_clean_ending(result, (1,))
    assert message in result.output, result.output
    assert time.monotonic() - started < TIME_LIMIT_S


def test_billion_laughs_in_a_memory_capped_process(tmp_path: Path) -> None:
    """The same refusal with the address space capped at 1.5 GiB: the expansion is never materialised."""
    import resource

    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))

    done = subprocess.run([sys.executable, "-m", "tfcalc", "params", "-p", str(path)], capture_output=True,
                          text=True, timeout=60, preexec_fn=cap, check=False)
    assert done.returncode == 1 and "expands to more than" in done.stderr, done.stderr


def test_a_model_at_every_limit_still_answers(tmp_path: Path) -> None:
    """Each field at its upper bound at once: the calculators stay bounded (grouped per-layer work)."""
    top = {key: high for key, (_, high) in INT_LIMITS.items()}
    document = {
        "vocab_size": top["vocab_size"], "hidden_size": top["hidden_size"], "num_layers": top["num_layers"],
        "num_attention_heads": top["num_attention_heads"], "num_kv_heads": top["num_kv_heads"],
        "head_dim": top["head_dim"], "intermediate_size": top["intermediate_size"],
        "max_context": top["max_context"], "sliding_window": top["sliding_window"] // 2,
        "sliding_window_layers": "even", "rope_theta": 1e15,
        "moe": {"num_experts": top["moe.num_experts"], "experts_per_token": top["moe.experts_per_token"],
                "expert_intermediate_size": top["moe.expert_intermediate_size"], "num_shared_experts": 1,
                "shared_expert_intermediate_size": 8, "dense_layers": "odd"},
    }
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(document))
    for command in (["kv-cache", "--batch", str(1 << 40)], ["params"], ["memory", "--context", "1m"]):
        result = invoke([*command, "-p", str(path), "-f", "json"])
        assert_clean_ending(result, (0,))
        assert json.loads(result.output)


@settings(max_examples=60)
@given(num_layers=st.integers(1, 200), window=st.integers(1, 5000), context=st.integers(1, 10_000),
       data=st.data())
def test_grouped_kv_cache_equals_the_per_layer_sum(num_layers: int, window: int, context: int,
                                                   data: st.DataObject) -> None:
    sliding = data.draw(st.sets(st.integers(0, num_layers - 1), max_size=num_layers))
    spec = load_model("llama3-8b").with_overrides(layers=num_layers, sliding_window=window,
                                                  sliding_window_layers=tuple(sorted(sliding)))
    per_layer = sum(tokens_held(spec, layer, context) for layer in range(num_layers))
    bf16 = get_dtype("bf16")
    assert kv_cache_exact_bytes(spec, bf16, context, 3) == bf16.bytes_for(3 * per_layer * 2 * 8 * 128)


# --- class 4: strict values -------------------------------------------------------------------------------------
TINY = ("vocab_size: 100\nhidden_size: 64\nnum_layers: 4\nnum_attention_heads: 4\nnum_kv_heads: 2\nhead_dim: 16\n"
        "intermediate_size: 128\n")
TINY_MOE = TINY + "moe: {num_experts: 4, experts_per_token: 2, expert_intermediate_size: 32"


@pytest.mark.parametrize("extra, message", [
    (TINY_MOE + ", router_bias: 'no'}\n", "field 'moe.router_bias' must be true or false, got 'no'"),
    (TINY + "qkv_bias: 1\n", "field 'qkv_bias' must be true or false, got 1"),
    (TINY + "sliding_window: 1.5\n", "field 'sliding_window' must be an integer, got 1.5"),
    (TINY + "num_layers: 4\n", "duplicate key 'num_layers' at line 8"),
    (TINY + "name: [a, b]\n", "field 'name' must be text, got ['a', 'b']"),
    (TINY + "activation: relu\n", "field 'activation' must be one of silu, gelu, gelu_tanh, swiglu_clamped"),
    (TINY + "norm_kind: batchnorm\n", "field 'norm_kind' must be one of rmsnorm, layernorm"),
    (TINY + "rope_theta: .inf\n", "field 'rope_theta' must be a finite number, got inf"),
    (TINY + "rope_theta: .nan\n", "field 'rope_theta' must be a finite number, got nan"),
    (TINY + "rope_scaling: {rope_type: magic}\n", "field 'rope_scaling.rope_type' must be one of linear"),
    (TINY + "rope_scaling: {rope_type: yarn, factor: -2}\n", "field 'rope_scaling.factor' must be positive"),
    (TINY + "sliding_window: 8\nsliding_window_layers: [1, 1]\n", "layer 1 is listed twice"),
    (TINY + "sliding_window: 8\nsliding_window_layers: [4]\n", "must be at most 3"),
    (TINY_MOE + ", dense_layers: [0, 0]}\n", "field 'moe.dense_layers': layer 0 is listed twice"),
    (TINY + "display_name: {a: 1}\n", "field 'display_name' must be text"),
    (TINY.replace("num_layers: 4", "num_layers: 4.0"), "field 'num_layers' must be an integer, got 4.0"),
])
def test_model_yaml_values_are_strict(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "strict.yaml"
    path.write_text(extra)
    result = invoke(["kv-cache", "-p", str(path)])
    assert_clean_ending(result, (1,))
    assert message in result.output and str(path) in result.output, result.output


@pytest.mark.parametrize("changes, message", [
    ({"hidden_act": "relu"}, "field 'hidden_act' 'relu' is not supported"),
    ({"rope_theta": float("nan")}, "field 'rope_theta' must be a finite number"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": float("inf")}}, "field 'rope_scaling.factor' must be a finite"),
    ({"tie_word_embeddings": "no"}, "field 'tie_word_embeddings' must be true or false"),
    ({"num_hidden_layers": 10**14}, "field 'num_hidden_layers' must be at most 10,000"),
    ({"max_position_embeddings": 10**20}, "field 'max_position_embeddings' must be at most"),
    ({"vocab_size": 10**401}, "field 'vocab_size' must be at most 16,777,216"),
])
def test_config_json_values_are_strict(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF_DOCS["llama3-8b"], **changes}))
    result = invoke(["params", "-c", str(path)])
    assert_clean_ending(result, (1,))
    assert message in result.output, result.output


def test_duplicate_json_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "vocab_size": 100, "vocab_size": 200}')
    result = invoke(["params", "-c", str(path)])
    assert_clean_ending(result, (1,))
    assert "duplicate key 'vocab_size'" in result.output


@pytest.mark.parametrize("line, message", [
    ("memory_gib: .nan", "field 'memory_gib' must be a finite number, got nan"),
    ("memory_gib: 1.0e+400", "field 'memory_gib' must be a finite number, got inf"),
    ("hbm_bandwidth_tb_s: .inf", "field 'hbm_bandwidth_tb_s' must be a finite number"),
    ("name: [a]", "field 'name' must be text"),
    ("interconnect_bidirectional_gb_s: '900'", "field 'interconnect_bidirectional_gb_s' must be a number"),
    ("memory_gib: 80\nmemory_gib: 40", "duplicate key 'memory_gib'"),
])
def test_gpu_yaml_values_are_strict(tmp_path: Path, line: str, message: str) -> None:
    text = preset_path("gpu", "h100-sxm").read_text()
    key = line.split(":")[0]
    body = "\n".join(row for row in text.splitlines() if not row.startswith(f"{key}:")) + "\n" + line + "\n"
    path = tmp_path / "gpu.yaml"
    path.write_text(body)
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_gpu(str(path))


@settings(max_examples=200)
@given(st.integers(1, 1 << 62))
def test_sizes_are_parsed_exactly(value: int) -> None:
    assert parse_size(str(value)) == value
    assert parse_size(f"{value:_}") == value
    if value % 1024 == 0:
        assert parse_size(f"{value // 1024}k") == value


def test_batch_beyond_float_precision_is_exact() -> None:
    rows = json.loads(invoke(["kv-cache", "-p", "llama3-8b", "--batch", "9007199254740993", "-f", "json"]).output)
    assert rows[0]["batch"] == 9007199254740993
    assert rows[0]["kv_cache_bytes"] == 9007199254740993 * 131_072 * 8192


# --- class 6: one error format and exit codes ----------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["plan", "--max-gpus", "abc"], ["kv-cache", "-p"], ["kv-cache", "--config"], ["kv-cach"],
    ["kv-cache", "-p", "llama3-8b", "--no-such-option"], ["presets", "show"], ["presets"], [],
    ["kv-cache", "-p", "llama3-8b", "--batch", "9" * 401], ["kv-cache", "-p", "no-such-model"],
    ["kv-cache", "-p", "llama3-8b", "--format", "xml"], ["memory", "-p", "llama3-8b", "--prefill-chunk", "nan"],
])
def test_usage_errors_are_one_line_and_exit_2(args: list[str]) -> None:
    result = invoke(args)
    assert_clean_ending(result, (2,))
    assert not set("╭╮╰╯│") & set(result.stderr), result.stderr  # no Click/Rich error box
    assert result.stderr.startswith("error:") and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("args, option", [
    (["kv-cache", "-p", "llama3-8b", "-o", ""], "'--output' / '-o'"),
    (["memory", "-c", " "], "'--config' / '-c'"),
    (["estimate", "-p", "llama3-8b", "-g", "h100-sxm", "--calibration", ""], "'--calibration'"),
    (["capacity", "-p", "llama3-8b", "-g", "h100-sxm", "--rate", "1", "--lengths-csv", "", "--ttft", "p90=1s",
      "--tpot", "p90=50ms"], "'--lengths-csv'"),
    (["capacity", "-p", "llama3-8b", "-g", "h100-sxm", "--rate", "1", "--input-len", "100", "--output-len", "100",
      "--ttft", "p90=1s", "--tpot", "p90=50ms", "--plot", ""], "'--plot'"),
])
def test_an_empty_file_name_is_named_as_such(args: list[str], option: str) -> None:
    """An empty file name was the folder "." (Path("")): "cannot write .: it is a folder", "config.json: no such
    file". It is refused as what it is, before any work."""
    result = invoke(args)
    assert_clean_ending(result, (2,))
    assert result.stderr.startswith(f"error: invalid value for {option}: an empty file name"), result.stderr
    assert result.stderr.count("\n") == 1


TOKENS = ["kv-cache", "params", "memory", "presets", "list", "show", "nope", "-p", "--preset", "-c", "--config",
          "--context", "--batch", "-b", "--kv-dtype", "-f", "--format", "-o", "--compare-attention", "-w",
          "--kind", "--version", "-h", "llama3-8b", "Meta-Llama/Llama-3.1-70B", "gpu", "h100-sxm", "x", "0", "-1",
          "1k", "9" * 30, "abc", "csv", "json", "table", "xml", "fp8", "bf16", "", "../../etc/passwd", "-",
          "/dev/null", "1.5", "nan", "out.csv", "out.json", "\x1b[2J", "experts=mxfp4"]


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.lists(st.sampled_from(TOKENS), max_size=7))
def test_random_command_lines_end_cleanly(tmp_path: Path, argv: list[str]) -> None:
    previous = os.getcwd()
    os.chdir(tmp_path)  # relative outputs land in the temporary folder
    try:
        assert_clean_ending(invoke(argv))
    finally:
        os.chdir(previous)


def _tfcalc(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tfcalc", *args], text=True, timeout=60, check=False, **kwargs)


@pytest.mark.parametrize("args, code", [(["kv-cache", "-p", "no-such-model"], 2), (["kv-cache", "--bad"], 2),
                                        (["kv-cache", "-c", "/nonexistent.json"], 2)])
def test_exit_codes_hold_with_stderr_closed(args: list[str], code: int) -> None:
    done = _tfcalc(args, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(2))
    assert done.returncode == code


@pytest.mark.parametrize("signum, code, message", [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated")])
@pytest.mark.parametrize("stderr_closed", [False, True])
def test_signals_exit_130_and_143(tmp_path: Path, signum: int, code: int, message: str,
                                  stderr_closed: bool) -> None:
    """A run blocked opening a FIFO nobody reads is interrupted: one line, exit 128 + signal, FIFO intact."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    def child_setup() -> None:
        # a run started as a shell's background job inherits SIGINT ignored, and Python then installs no
        # handler: give the child the disposition of a foreground command, whatever ran these tests
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if stderr_closed:
            os.close(2)

    process = subprocess.Popen(
        [sys.executable, "-m", "tfcalc", "kv-cache", "-p", "llama3-8b", "-f", "csv", "-o", str(fifo)],
        stdout=subprocess.DEVNULL, stderr=None if stderr_closed else subprocess.PIPE, text=True,
        preexec_fn=child_setup)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _blocked_on_open(process.pid, fifo):
        time.sleep(0.05)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == code
    if not stderr_closed:
        assert stderr == f"error: {message}\n"
    assert fifo.is_fifo()


def _blocked_on_open(pid: int, fifo: Path) -> bool:
    """Whether the process has got as far as opening the FIFO (its Python code is running, handlers installed)."""
    try:
        return "fifo_wait" in Path(f"/proc/{pid}/wchan").read_text() or _opened(pid, fifo)
    except OSError:
        return False


def _opened(pid: int, fifo: Path) -> bool:
    syscall = Path(f"/proc/{pid}/syscall").read_text().split()
    return bool(syscall) and syscall[0] in ("2", "257")  # open / openat, blocked until a reader comes


# --- class 5: stdout that cannot take the text ----------------------------------------------------------------
def test_ascii_only_stdout(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    table = _tfcalc(["kv-cache", "-p", "llama3-8b"], capture_output=True, env=env)
    assert table.returncode == 0 and table.stdout.isascii(), table.stderr
    assert "\nllama3-8b  " in table.stdout and "\n------" in table.stdout  # the header rule in ASCII look-alikes
    model = tmp_path / "mod\u00e8le.yaml"
    model.write_text(TINY + "name: Mod\u00e8le \u2014 \u00b5\n", encoding="utf-8")
    as_json = _tfcalc(["kv-cache", "-p", str(model), "-f", "json"], capture_output=True, env=env)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)[0]["model"] == "Mod\u00e8le \u2014 \u00b5"
    as_csv = _tfcalc(["kv-cache", "-p", str(model), "-f", "csv"], capture_output=True, env=env)
    assert as_csv.returncode == 1 and as_csv.stderr.startswith("error: stdout's encoding (ascii) cannot represent")
    assert as_csv.stderr.count("\n") == 1


# --- class 7: terminal safety and preset names ---------------------------------------------------------------
def test_escape_sequences_never_reach_the_terminal(tmp_path: Path) -> None:
    model = tmp_path / "evil\x1b[2J.yaml"
    model.write_text(TINY + "name: \"\\e]0;pwned\\a\\e[31mred\\u202e\\x9b2J\"\n", encoding="utf-8")
    for fmt in ("table", "json"):
        result = invoke(["kv-cache", "-p", str(model), "-f", fmt])
        assert_clean_ending(result, (0,))
        assert "red" in result.output
    broken = tmp_path / "bad\x1b]0;x\x07.yaml"
    broken.write_text("num_layers: [\n")
    result = invoke(["kv-cache", "-p", str(broken)])
    assert_clean_ending(result, (1,))


@settings(max_examples=60)
@given(name=st.one_of(st.sampled_from(["../../etc/passwd", "../models/llama3-8b", "/etc/hostname", "./x", "..",
                                       "gpus/h100-sxm", "models/../gpus/h100-sxm", "llama3-8b.yaml"]),
                      st.text(alphabet="./-abc\\~", min_size=1, max_size=12)))
def test_presets_show_takes_names_not_paths(name: str) -> None:
    result = invoke(["presets", "show", "--", name])
    assert_clean_ending(result, (2,))
    assert "not a preset name" in result.output or "unknown preset" in result.output


def test_presets_show_finds_either_kind_in_any_case_and_by_alias() -> None:
    for name, kind in (("H100-SXM", "gpu"), ("Llama3-70B", "model"), ("meta-llama/Llama-3.1-70B", "model")):
        result = invoke(["presets", "show", name, "-f", "json"])
        assert result.exit_code == 0, result.output
        rows = json.loads(result.output)
        assert ("memory_gib" in {row["field"] for row in rows}) == (kind == "gpu")
        assert set(rows[0]) == {"field", "value", "source"}  # the table's footnote numbers stay in the table
    header = invoke(["presets", "show", "llama3-70b", "-f", "csv"]).output.splitlines()[0]
    assert header == "field,value,source"


def _spec_classes() -> tuple[tuple[type, str], ...]:
    """Every spec dataclass and the prefix its fields' keys carry."""
    from tfcalc.spec.model import (
        CompressedAttentionSpec,
        EncoderSpec,
        FullAttentionSpec,
        LinearAttentionSpec,
        MLASpec,
        ModelSpec,
        MoESpec,
        RopeScaling,
        WeightException,
    )

    return ((ModelSpec, ""), (MoESpec, "moe."), (MLASpec, "mla."), (RopeScaling, "rope_scaling."),
            (WeightException, "quantized_weight_exceptions."), (EncoderSpec, "encoder."),
            (LinearAttentionSpec, "linear_attention."), (FullAttentionSpec, "full_attention."),
            (CompressedAttentionSpec, "compressed_attention."))


def test_every_spec_field_is_checked() -> None:
    """Each field of each spec dataclass refuses a value of no known type (a field added with a type the
    checker does not read would otherwise go unchecked); ``extra`` is the one free-form field."""
    from dataclasses import fields

    from tfcalc.spec.model import _checkers

    for cls, prefix in _spec_classes():
        checks = _checkers(cls, prefix)
        assert [name for name, _, _ in checks] == [f.name for f in fields(cls)]
        for name, key, check in checks:
            if name == "extra":
                continue
            with pytest.raises(SpecError, match=f"field '{key}'"):
                check(key, object())


def _number_checks(annotation: str) -> dict[str, Any]:
    """Dotted field name -> its check, for every spec field declared ``annotation`` or ``annotation | None``."""
    from dataclasses import fields

    from tfcalc.spec.model import _checkers

    checks = {}
    for cls, prefix in _spec_classes():
        types = {f.name: str(f.type).removesuffix(" | None") for f in fields(cls)}
        checks.update({key: check for name, key, check in _checkers(cls, prefix) if types[name] == annotation})
    return checks


def test_every_number_field_is_checked_at_its_bounds() -> None:
    """Each int and float field accepts its bounds and refuses the value just outside them (INT_LIMITS /
    FLOAT_LIMITS; positive when not listed), infinities, NaN, bools and text; every limit names a real field."""
    import math

    from tfcalc.spec.model import FLOAT_LIMITS, POSITIVE

    ints, floats = _number_checks("int"), _number_checks("float")
    assert set(INT_LIMITS) <= set(ints) and set(FLOAT_LIMITS) <= set(floats)
    for key, check in ints.items():
        low, high = INT_LIMITS.get(key, (1, 1 << 62))
        check(key, low)
        check(key, high)
        for bad in (low - 1, high + 1, 1.0, True):
            with pytest.raises(SpecError, match=f"field '{key}'"):
                check(key, bad)
    for key, check in floats.items():
        low, high = FLOAT_LIMITS.get(key, (POSITIVE, math.inf))
        check(key, 1e-300 if low == POSITIVE else float(low))
        if math.isfinite(high):
            check(key, float(high))
        below = 0.0 if low == POSITIVE else math.nextafter(low, -math.inf)
        for bad in (below, math.nextafter(high, math.inf), math.nan, -math.inf, "1", True):
            with pytest.raises(SpecError, match=f"field '{key}'"):
                check(key, bad)


@pytest.mark.parametrize("field, value, accepted", [
    ("norm_weight_offset", 0.0, True), ("norm_weight_offset", 1.0, True), ("norm_weight_offset", -0.5, True),
    ("norm_weight_offset", 2.0, False), ("attn_logit_softcapping", 0.0, False),
    ("final_logit_softcapping", -30.0, False), ("query_pre_attn_scalar", 0, False),
    ("rope_scaling", {"rope_type": "yarn", "factor": 40.0, "mscale": 0.0, "mscale_all_dim": 0}, True),
    ("rope_scaling", {"rope_type": "yarn", "factor": 40.0, "beta_slow": 0}, False),
    ("moe", {"num_experts": 8, "experts_per_token": 2, "expert_intermediate_size": 16, "routed_scaling_factor": 0},
     False),
    ("moe", {"num_experts": 8, "experts_per_token": 2, "expert_intermediate_size": 16, "expert_groups": 3}, False),
    ("moe", {"num_experts": 8, "experts_per_token": 2, "expert_intermediate_size": 16, "expert_groups": 4,
             "groups_per_token": 5}, False),
    ("moe", {"num_experts": 8, "experts_per_token": 2, "expert_intermediate_size": 16, "router_scoring": "tanh"},
     False),
])
def test_issue14_fields_in_a_user_yaml(field: str, value: object, accepted: bool, tmp_path: Path) -> None:
    """The numerics and routing fields issue 14 added: zero or negative where it means something (a plain
    norm, yarn's mscale off), refused with a one-line error naming the field elsewhere."""
    document = {"vocab_size": 1000, "hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "num_kv_heads": 4,
                "head_dim": 16, "intermediate_size": 128, field: value}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(document))
    result = invoke(["params", "-p", str(path), "-f", "json"])
    if accepted:
        assert_clean_ending(result, (0,))
    else:
        assert_clean_ending(result, (1,))
        name = field if field not in ("moe", "rope_scaling") else f"{field}."
        assert name in result.output, result.output


def test_install_hints_are_commands_that_work() -> None:
    """Each hint names the packages of pyproject.toml's extra, as pip takes them (tfcalc itself is not on PyPI:
    'pip install tfcalc[profile]' would not work), and the CPU-only PyTorch index for torch."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from tfcalc.errors import TORCH_CPU_INDEX, install_command, missing_matplotlib_message, missing_torch_message

    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra in ("profile", "plot"):
        assert sorted(install_command(extra).removeprefix("pip install ").split()) == sorted(
            f"'{r}'" for r in extras[extra])
    assert "tfcalc[" not in missing_torch_message() + missing_matplotlib_message()
    assert f"pip install torch --index-url {TORCH_CPU_INDEX}" in missing_torch_message()
