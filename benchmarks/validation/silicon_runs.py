"""Extract NVIDIA's measured serving runs from aiconfigurator's ``silicon_sample.csv`` into
benchmarks/validation/silicon_runs.json: every aggregated run (one engine instance, no attention data parallelism, no
pipeline) of a model and GPU tfcalc has presets for, at every concurrency (4-512).

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install
aiconfigurator==0.12.0``) and run

    python benchmarks/validation/silicon_runs.py [PATH/TO/silicon_sample.csv] [--attention-dp]

(default: the file inside the installed ``aiconfigurator_core`` package). Each row is one closed-loop benchmark of
``concurrency`` clients with fixed input and output lengths; the CSV gives the mean TTFT and TPOT; ``id`` is the
CSV's row id.

The CSV's labels are mapped to tfcalc's formats by what each checkpoint ships (its Hugging Face config):
gpt-oss-120b's rows say ``nvfp4`` but the checkpoint is MXFP4 experts with bf16 attention; Qwen3-235B-A22B-FP8 and
DeepSeek-R1 are block-scale fp8 checkpoints whatever the row's label; ``fp4`` on Llama 3.1 70B is NVIDIA's NVFP4
checkpoint. DeepSeek-R1's fp4 rows are left out: NVIDIA's FP4 checkpoints differ in which attention projections they
quantise (DeepSeek-R1-0528-FP4-v2 adds ``wo``) and the row does not say which ran.

The CSV does not state the KV cache format; ``checkpoint_kv`` is the one the checkpoint declares, which an engine
whose ``--kv-cache-dtype auto`` follows the checkpoint uses (``EngineSpec.kv.checkpoint_dtype``; the replay resolves
it per engine version). The per-tensor fp8 and NVFP4 rows are NVIDIA ModelOpt checkpoints, and those declare an fp8
KV cache: the two aiconfigurator ships the quantization config of (model_configs/
nvidia--Llama-3.1-70B-Instruct-FP8_hf_quant_config.json, Qwen--Qwen3-32B-FP8-Static-PerTensor_config.json) say
``kv_cache_quant_algo: FP8`` / ``kv_cache_scheme: FP8``, as do all 18 NVFP4 and 4 FP8 ModelOpt configs it ships.
The others (bf16, Qwen's and DeepSeek's block-fp8, gpt-oss's MXFP4) declare none.

``deployment`` is ``aiconfigurator`` where the row's source is aiconfigurator's automated gap analysis
(``aic-auto-gap-analysis/data/<gpu>/<engine>/<version>/<model>.csv``: it serves the configurations aiconfigurator's
generator writes, then benchmarks them), else ``null`` (the dated sweeps and the database dump, whose engine
settings the CSV does not give). The replay takes that generator's engine settings for the former
(``capacity_validation.deployment_limits``).

The layout is ``tp_size`` and ``moe_ep_size``, except where the export multiplied them: in every one of the 160 rows
whose id names an expert-parallel layout (``..._tp8_ep8_...``) with ``moe_tp_size`` and ``moe_ep_size`` both above 1,
``tp_size`` holds their product (64 for tp 8 / ep 8, on an 8-GPU system). There, and in rows without such an id that
show the same pattern, tp is ``moe_tp_size``; where the id names tp, the id's value is used.

``--attention-dp`` writes the other aggregated runs instead, those with attention data parallelism, to
silicon_runs_dp.json: ``attention_dp_size`` ranks of one GPU each (``tp_size`` 1) whose experts span them
(``moe_tp_size`` 1, ``moe_ep_size`` = the ranks), with ``dp`` the ranks, ``tp`` 1 and ``ep`` = dp. Their
``batch_size`` is one rank's clients (the id's concurrency is dp times it: ``..._c256_...`` at 32 over 8 ranks);
``concurrency`` is all the ranks' clients. Rows of other shapes (``attention_dp_size`` 64 with ``moe_tp_size`` 8:
the export's products again, with no id to undo them) are left out.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

# aiconfigurator model path (last part) -> tfcalc preset or validation model file
MODELS = {
    "Llama-3.1-70B": "llama3-70b",
    "Llama-3.1-8B-Instruct": "llama3.1-8b",
    "Llama-3.1-8B-Instruct-FP8": "llama3.1-8b",
    "Qwen3-32B": "benchmarks/validation/models/qwen3-32b.yaml",
    "Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "DeepSeek-R1": "deepseek-v3",
    "DeepSeek-V3": "deepseek-v3",
    "gpt-oss-120b": "gpt-oss-120b",
}
SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
OUT = Path(__file__).parent / "silicon_runs.json"
OUT_DP = Path(__file__).parent / "silicon_runs_dp.json"
CHECKPOINT_KV = {"fp8": "fp8", "nvfp4": "fp8"}  # weight format -> KV format its (ModelOpt) checkpoint declares


def weights(model: str, row: dict) -> str | None:
    """tfcalc's weight format for one row, or None where the row's format is not a checkpoint tfcalc can name."""
    gemm = row["gemm_quant_mode"]
    if model == "gpt-oss-120b":
        return "experts=mxfp4,default=bf16" if row["precision"] == "fp4" else None
    if model == "Qwen3-235B-A22B-FP8":
        return "fp8_block"
    if model in ("DeepSeek-R1", "DeepSeek-V3"):
        return "fp8_block" if row["precision"] == "fp8" else None
    if gemm in ("", "bfloat16", "float16"):
        return "bf16"
    return {"fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}.get(gemm)


def source(text: str) -> str:
    """The row's data set: its source file's name (a dated sweep, or one engine version's gap-analysis table) or its
    database dump."""
    for part in text.split(";"):
        part = part.strip()
        if part.startswith("source_file="):
            return part.removeprefix("source_file=").rsplit("/", 1)[-1]
    return text.split(";")[0].strip()


def layout(row: dict) -> tuple[int, int]:
    """(tp, ep) of one row, undoing the export's tp_size = moe_tp_size x moe_ep_size (module docstring)."""
    tp, moe_tp = int(row["tp_size"]), int(row["moe_tp_size"] or 0)
    ep = max(1, int(row["moe_ep_size"] or 1))   # dense rows say 0
    named = re.search(r"_tp(\d+)_", row["id"])
    if named:
        tp = int(named.group(1))
    elif moe_tp > 1 and ep > 1 and tp == moe_tp * ep:
        tp = moe_tp
    return tp, ep


def deployment(text: str) -> str | None:
    """Who wrote the run's engine settings: ``aiconfigurator`` for its gap analysis (module docstring)."""
    return "aiconfigurator" if "aic-auto-gap-analysis/" in text else None


def dp_layout(row: dict) -> tuple[int, int, int] | None:
    """(dp, tp, ep) of an attention-data-parallel row of tp-1 ranks sharing the experts, else None."""
    dp = int(row["attention_dp_size"] or 1)
    moe_tp, ep = int(row["moe_tp_size"] or 0), int(row["moe_ep_size"] or 0)
    if dp > 1 and int(row["tp_size"] or 0) == 1 and moe_tp == 1 and ep == dp:
        return dp, 1, ep
    return None


def extract(rows: list[dict], attention_dp: bool = False) -> list[dict]:
    """The aggregated runs without pipeline stages: without attention data parallelism, or (``attention_dp``) those
    of dp_layout's shape."""
    runs = []
    for row in rows:
        model = row["model_path"].split("/")[-1]
        if model not in MODELS or row["system"] not in SYSTEMS or row["mode"] != "agg":
            continue
        wide = dp_layout(row)
        if row["pp_size"] not in ("", "1") or (row["attention_dp_size"] not in ("", "1")) != attention_dp:
            continue
        if attention_dp and wide is None:
            continue
        fmt = weights(model, row)
        if fmt is None or not row["silicon_ttft_ms"] or not row["silicon_tpot_ms"]:
            continue
        tp, ep = layout(row) if wide is None else wide[1:]
        runs.append({**({"dp": wide[0]} if wide is not None else {}),
            "id": row["id"], "source": source(row["silicon_data_source"]),
            "engine": row["backend"], "engine_version": row["backend_version"], "model": MODELS[model],
            "gpu": SYSTEMS[row["system"]], "weights": fmt, "checkpoint_kv": CHECKPOINT_KV.get(fmt), "tp": tp, "ep": ep,
            "concurrency": int(row["batch_size"]) * (wide[0] if wide is not None else 1),
            "prompt": int(row["isl"]), "gen": int(row["osl"]),
            "ttft_ms": round(float(row["silicon_ttft_ms"]), 3), "tpot_ms": round(float(row["silicon_tpot_ms"]), 4),
            "deployment": deployment(row["silicon_data_source"]),
        })
    runs.sort(key=lambda r: (r["engine"], r["model"], r["gpu"], r["weights"], r["tp"], r["prompt"], r["gen"],
                             r["concurrency"], r["id"]))
    return runs


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if args:
        path = Path(args[0])
    else:
        import aiconfigurator_core  # type: ignore[import-not-found]

        path = Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv"
    attention_dp = "--attention-dp" in sys.argv[1:]
    with path.open(newline="") as f:
        runs = extract(list(csv.DictReader(f)), attention_dp)
    out = OUT_DP if attention_dp else OUT
    out.write_text("[\n" + ",\n".join(json.dumps(r) for r in runs) + "\n]\n")  # one run per line
    print(f"{len(runs)} runs -> {out}")


if __name__ == "__main__":
    main()
