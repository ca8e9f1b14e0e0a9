"""The one column registry: every command's columns come from it, every key a command writes is registered,
and each key has one header, kind and unit wherever it appears."""

from __future__ import annotations

import importlib
import json
import pkgutil

import pytest
from typer.testing import CliRunner

import tfcalc.cli
from tfcalc.cli import app
from tfcalc.output.columns import REGISTRY, Column, format_cell, pick, varies, wide

runner = CliRunner()


def _declared_columns() -> list[tuple[str, Column]]:
    """Every Column in a module-level list or dict of lists of every tfcalc.cli module."""
    found = []
    for info in pkgutil.iter_modules(tfcalc.cli.__path__):
        module = importlib.import_module(f"tfcalc.cli.{info.name}")
        for name, value in vars(module).items():
            lists = value.values() if isinstance(value, dict) else [value]
            for item in lists:
                if isinstance(item, list) and item and all(isinstance(c, Column) for c in item):
                    found += [(f"{info.name}.{name}", c) for c in item]
    return found


def test_every_command_column_is_the_registered_one() -> None:
    declared = _declared_columns()
    assert len({where.split(".")[0] for where, _ in declared}) >= 7  # kv_cache, params, ..., profile, bench
    for where, c in declared:
        assert c.key in REGISTRY, f"{where}: column '{c.key}' is not registered"
        registered = REGISTRY[c.key]
        assert (c.header, c.kind, c.unit) == (registered.header, registered.kind, registered.unit), where


CALCULATOR_COMMANDS = [
    ["kv-cache", "-p", "gemma2-9b,deepseek-v3"], ["params", "-p", "deepseek-v3"], ["memory", "-p", "gpt-oss-20b"],
    ["plan", "-p", "llama3-70b", "-n", "4"], ["estimate", "-p", "mixtral-8x7b", "--tp", "2", "--ep", "2"],
    ["presets", "list"], ["presets", "list", "--kind", "gpu"], ["presets", "list", "--kind", "engine"],
    ["presets", "list", "--kind", "interconnect"], ["presets", "show", "h100-sxm"],
    *(["capacity", "-p", "llama3-8b", "--gpu", "h100-sxm", "--max-num-seqs", "64", "--rate", "4", "--ttft", "p90=1s",
       "--itl", "p99.9=100ms", "--e2e", "mean=20s", "--speculative", "2", "--disaggregated", "--no-simulate",
       "--points", points] for points in ("frontier", "all")),
]


@pytest.mark.parametrize("command", CALCULATOR_COMMANDS, ids=lambda c: " ".join(c))
def test_every_key_a_command_writes_is_registered(command: list[str]) -> None:
    rows = json.loads(runner.invoke(app, [*command, "-f", "json"]).stdout)
    keys = {key for row in rows for key in row}
    assert keys and all(key in REGISTRY for key in keys), sorted(key for key in keys if key not in REGISTRY)


def test_one_header_per_key_and_names_that_carry_their_unit() -> None:
    for key, c in REGISTRY.items():
        assert c.key == key and c.show == "always"
        if key.endswith("_bytes") or "_bytes_per_gpu" in key:
            assert c.kind in ("bytes", "bytes_exact"), key
        if key.endswith("_bytes_per_s"):
            assert (c.kind, c.unit) == ("si", "B/s"), key  # bandwidth in decimal units everywhere
        if key.endswith("_flops_per_s"):
            assert (c.kind, c.unit) == ("si", "FLOP/s"), key
        if key.endswith("_s") and not key.endswith("_per_s"):
            assert c.kind == "seconds", key
        if c.kind == "rate":
            assert c.unit in c.header, key  # the unit is in the header, the cells are plain numbers


def test_a_family_registers_the_keys_a_command_builds_from_its_input() -> None:
    """Capacity's latency columns, one per target the user gives: each key resolves to one column, named as the
    target is; iterating the registry gives the fixed keys only (completion, suggestions)."""
    assert REGISTRY["operating_ttft_p99_9_s"] == Column("operating_ttft_p99_9_s", "TTFT p99.9", "seconds")
    assert REGISTRY["operating_tpot_mean_s"].header == "TPOT mean"
    assert "operating_ttft_p90_s" in REGISTRY and "operating_ttft_p90" not in REGISTRY
    assert "operating_ttft_p90_s" not in set(REGISTRY) and "operating_foo_p90_s" not in REGISTRY
    with pytest.raises(KeyError):
        REGISTRY["operating_ttft_soon_s"]


def test_pick_marks_and_refuses_unregistered_keys() -> None:
    columns = pick("model", varies("engine"), wide("capacity_bytes"))
    assert [(c.key, c.show) for c in columns] == [("model", "always"), ("engine", "varies"),
                                                  ("capacity_bytes", "wide")]
    with pytest.raises(KeyError, match="register it"):
        pick("no_such_column")


def test_cells() -> None:
    assert format_cell(40 << 30, REGISTRY["kv_cache_bytes"]) == "40.00 GiB"
    assert format_cell(3.35e12, REGISTRY["hbm_bandwidth_bytes_per_s"]) == "3.35 TB/s"
    assert format_cell(6475.63, REGISTRY["decode_tokens_per_s"]) == "6,475.6"
    assert format_cell(0.02245, REGISTRY["ttft_s"]) == "22.45 ms"
    assert format_cell("experts=mxfp4,default=bf16", REGISTRY["weights_dtype"]) == "experts=mxfp4, default=bf16"
    assert format_cell(True, REGISTRY["fits"]) == "yes" and format_cell(True, REGISTRY["value"]) == "true"
    assert format_cell(None, REGISTRY["fits"]) == "—"


def test_columns_option_selects_table_and_export_columns() -> None:
    args = ["plan", "-p", "llama3-70b", "-n", "2,4", "--columns", "num_gpus,max_concurrent_sequences,fits"]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert table.stdout.splitlines()[1].split() == ["GPUs", "max", "seqs", "fits"]
    rows = json.loads(runner.invoke(app, [*args, "-f", "json"]).stdout)
    assert [list(r) for r in rows] == [["num_gpus", "max_concurrent_sequences", "fits"]] * 2
    csv_text = runner.invoke(app, [*args, "-f", "csv"]).stdout
    assert csv_text.splitlines()[0] == "num_gpus,max_concurrent_sequences,fits"


def test_columns_and_wide_errors_before_any_work() -> None:
    unknown = runner.invoke(app, ["kv-cache", "-p", "llama3-8b", "--columns", "kv_cache_byte"])
    assert unknown.exit_code == 2 and "unknown column 'kv_cache_byte'; did you mean kv_cache_bytes" in unknown.stderr
    both = runner.invoke(app, ["kv-cache", "-p", "llama3-8b", "--columns", "model", "--wide"])
    assert both.exit_code == 2 and "not both" in both.stderr
    absent = runner.invoke(app, ["kv-cache", "-p", "llama3-8b", "--columns", "model,ttft_s"])
    assert absent.exit_code == 0 and "no column ttft_s" in absent.stderr and "—" in absent.stdout


def test_wide_shows_what_csv_has() -> None:
    default = runner.invoke(app, ["plan", "-p", "llama3-70b", "-n", "4"]).stdout
    wide_text = runner.invoke(app, ["plan", "-p", "llama3-70b", "-n", "4", "--wide"]).stdout
    header = default.splitlines()[1]
    assert "79.19 GiB" not in default and "79.19 GiB" in wide_text and "verdict" in wide_text
    assert len(wide_text.splitlines()[1]) > len(header)


def test_step_group_headers_read_as_explain_names_them() -> None:
    from tfcalc.calc.latency import GROUPS
    from tfcalc.report.estimate import GROUP_LABELS

    for group in GROUPS:
        for phase in ("prefill", "decode"):
            assert REGISTRY[f"{phase}_{group}_s"].header == f"{phase} {GROUP_LABELS[group]}"


def test_the_recurrent_layer_count_is_not_named_after_one_kind() -> None:
    # the header read "Gated DeltaNet layers" over Nemotron-H's Mamba-2 and Kimi Linear's KDA counts as well
    result = runner.invoke(app, ["kv-cache", "-p", "nemotron-h-56b,kimi-linear-48b-a3b", "--context", "8k", "--wide"],
                           env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert "DeltaNet" not in result.output and REGISTRY["linear_layers"].header == "recurrent layers"
    rows = json.loads(runner.invoke(app, ["kv-cache", "-p", "nemotron-h-56b,kimi-linear-48b-a3b", "-f", "json"]).output)
    # Nemotron-H 56B: 54 Mamba-2 of its 118 blocks (hybrid_override_pattern); Kimi Linear: 20 KDA of 27 layers
    assert [(r["attention"], r["linear_layers"]) for r in rows] == [("GQA + Mamba-2", 54), ("MLA + KDA", 20)]
