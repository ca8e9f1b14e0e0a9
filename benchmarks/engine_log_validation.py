"""Held-out check of `tfcalc plan` against public engine startup logs (docs/planning.md, "Checked against real logs").

Each case of benchmarks/validation/engine_logs.json is one engine start with every memory setting stated beside its
log; the script runs `tfcalc plan` in-process with the case's arguments (the engine preset covering the log's
version) and prints a markdown table of logged vs predicted weights, KV budget, KV tokens and maximum concurrency
per GPU, then the summary the data file documents. Nothing is fitted to these logs.

Usage: python benchmarks/engine_log_validation.py
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

DATA = Path(__file__).parent / "validation" / "engine_logs.json"
GIB = 1 << 30
TOLERANCE = 0.05   # the held-out engine_logs test's band on KV tokens (tests/calc/test_plan_engines.py)


def load() -> dict:
    """The data file: its about text, documented summary and cases."""
    return json.loads(DATA.read_text())


def plan_row(args: list[str]) -> dict:
    """`tfcalc plan ARGS -f json`, in-process as the tests run it: the first row (exit 1, 'does not fit', still
    prints it)."""
    from typer.testing import CliRunner

    from tfcalc.cli import app

    result = CliRunner().invoke(app, ["plan", *args, "-f", "json"])
    if result.exit_code not in (0, 1) or not result.stdout.strip():
        raise RuntimeError(f"tfcalc plan {' '.join(args)} failed: {result.output.strip()}")
    return json.loads(result.stdout)[0]


def predicted(row: dict) -> dict:
    """Per-GPU figures of a plan row in the log's units; concurrency as vLLM prints it for full attention:
    blocks / ceil(max_model_len / block) (vllm/v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config)."""
    blocks = row["kv_tokens_per_gpu"] // row["block_size"]
    return {"weights_gib": row["weights_bytes_per_gpu"] / GIB, "kv_budget_gib": row["kv_budget_bytes_per_gpu"] / GIB,
            "kv_tokens": row["kv_tokens_per_gpu"],
            "max_concurrency": blocks / math.ceil(row["context"] / row["block_size"]), "engine": row["engine"]}


def error(logged: float | None, pred: float) -> float | None:
    """Relative error of the prediction, pred / logged - 1; None where the log has no figure."""
    return None if logged is None else pred / logged - 1


def evaluate(cases: list[dict]) -> list[dict]:
    """Every case with its prediction and the relative errors on the four figures."""
    out = []
    for case in cases:
        pred = predicted(plan_row(case["args"]))
        logged = case["logged"]
        errors = {k: error(logged.get(k), pred[k]) for k in ("weights_gib", "kv_budget_gib", "kv_tokens",
                                                             "max_concurrency")}
        out.append({"case": case, "pred": pred, "errors": errors})
    return out


def summary(results: list[dict]) -> dict:
    """Cases, how many within ±5 % on KV tokens, median |KV-token error| in percent (one decimal)."""
    token_errors = [abs(r["errors"]["kv_tokens"]) for r in results]
    return {"cases": len(results), "kv_tokens_within_5pct": sum(e <= TOLERANCE for e in token_errors),
            "median_abs_kv_tokens_error_pct": round(100 * statistics.median(token_errors), 1)}


def _cell(logged: float | None, pred: float, err: float | None, fmt: str) -> str:
    if logged is None:
        return f"— / {pred:{fmt}}"
    return f"{logged:{fmt}} / {pred:{fmt}} ({100 * err:+.1f} %)"


def markdown(results: list[dict]) -> str:
    """The table: logged / predicted (error) per figure, and the preset each case ran under."""
    lines = ["| case | engine@version (preset) | GPU | tp | weights GiB | KV GiB | KV tokens | max concurrency |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        c, p, e, lg = r["case"], r["pred"], r["errors"], r["case"]["logged"]
        lines.append(
            f"| {c['id']} | {c['engine']}@{c['version']} ({p['engine']}) | {c['gpu_count']} x {c['gpu']} "
            f"| {c['settings']['tp']} | {_cell(lg.get('weights_gib'), p['weights_gib'], e['weights_gib'], '.2f')} "
            f"| {_cell(lg.get('kv_budget_gib'), p['kv_budget_gib'], e['kv_budget_gib'], '.2f')} "
            f"| {_cell(lg.get('kv_tokens'), p['kv_tokens'], e['kv_tokens'], ',')} "
            f"| {_cell(lg.get('max_concurrency'), p['max_concurrency'], e['max_concurrency'], '.2f')} |")
    return "\n".join(lines)


def main() -> None:
    data = load()
    results = evaluate(data["cases"])
    print(markdown(results))
    s = summary(results)
    print(f"\n{s['cases']} cases; {s['kv_tokens_within_5pct']} within ±5 % on KV tokens; "
          f"median |KV-token error| {s['median_abs_kv_tokens_error_pct']} %")
    for r in results:
        if r["case"].get("preset_note"):
            print(f"- {r['case']['id']}: {r['case']['preset_note']}")


if __name__ == "__main__":
    main()
