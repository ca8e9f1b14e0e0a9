"""aiconfigurator's and tfcalc's decode step against NVIDIA's measured serving runs, by tensor-parallel degree: does
a predictor that sums isolated kernel times drift with tp the way forward_sync_fit.py's per-peer term says?

    python benchmarks/validation/aic_silicon_drift.py          # needs aiconfigurator 0.12 installed (~1 min)

The runs are forward_sync_fit.py's selection (concurrency <= 8, >= 1,000 output tokens: the TPOT is the decode
step's) plus TensorRT-LLM's Llama 3.1 8B on the H100 at concurrency 8 (512 output tokens; the only small model with
runs at tp 1-8). Each is priced by ``aiconfigurator cli estimate --estimate-mode static`` at batch = concurrency,
ISL = prompt, OSL = output (its own kernel tables, the run's engine, the newest table version it has) and by tfcalc
as capacity_validation.py --silicon-all replays it. Printed: the median TPOT error (predicted / measured - 1) of
each per engine, GPU and tp, and the change of that median from tp 1 (or the smallest tp measured) to tp 8
(about 1m40s on two cores).
"""

from __future__ import annotations

import logging
import statistics
import sys
import warnings
from multiprocessing import Pool
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(HERE))

# tfcalc's GPU preset -> aiconfigurator's system
AIC_SYSTEM = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm"}
# (model, tfcalc weights) -> (aiconfigurator model path, gemm quant, moe quant)
AIC_MODEL = {
    ("llama3-70b", "fp8"): ("meta-llama/Meta-Llama-3.1-70B", "fp8", None),
    ("llama3-70b", "nvfp4"): ("meta-llama/Meta-Llama-3.1-70B", "nvfp4", None),
    ("llama3.1-8b", "bf16"): ("meta-llama/Meta-Llama-3.1-8B", "bfloat16", None),
    ("qwen3-32b", "bf16"): ("Qwen/Qwen3-32B", "bfloat16", None),
    ("gpt-oss-120b", "experts=mxfp4,default=bf16"): ("openai/gpt-oss-120b", "bfloat16", "w4a16_mxfp4"),
}


def _name(point: dict) -> str:
    """A preset's name, or a model file's stem (``llama3.1-8b`` is a name: its ".1-8b" is no file suffix)."""
    model = str(point["model"])
    return Path(model).stem if model.endswith((".yaml", ".yml", ".json")) else model


def _selected(point: dict) -> bool:
    from forward_sync_fit import _selected as fit_selection

    small = (_name(point) == "llama3.1-8b" and point["engine"] == "trtllm"
             and point["gpu"] == "h100-sxm" and point["concurrency"] == 8 and point["gen"] == 512)
    return fit_selection(point) or small


def _aic_tpot_ms(point: dict) -> float | None:
    """aiconfigurator's static-batch TPOT for one run, or None where it cannot price it."""
    import aiconfigurator_points as collect

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    from aiconfigurator.cli.api import cli_estimate

    path, gemm, moe = AIC_MODEL[(_name(point), point["weights"])]
    system = AIC_SYSTEM[point["gpu"]]
    kwargs = dict(mode="static", backend_name=point["engine"], isl=point["prompt"], osl=point["gen"],
                  batch_size=point["concurrency"], tp_size=point["tp"], gemm_quant_mode=gemm,
                  kvcache_quant_mode="fp8" if point.get("checkpoint_kv") == "fp8" else "bfloat16")
    if moe is not None:
        ep = point.get("ep") or 1
        kwargs.update(moe_tp_size=point["tp"] // ep, moe_ep_size=ep,
                      moe_quant_mode=collect.ENGINE_MOE_QUANT.get((point["engine"], system, moe), moe))
    try:
        return float(cli_estimate(path, system, **kwargs).raw["tpot"])
    except Exception:  # noqa: BLE001 - a configuration aiconfigurator has no rows for
        return None


def _row(point: dict) -> dict:
    from capacity_validation import _replay

    replay = _replay(point)
    return {**point, "aic_tpot_ms": _aic_tpot_ms(point),
            "tfcalc_tpot_ms": replay["predicted_tpot_ms"] if replay["fits"] else None}


def main() -> None:
    from capacity_validation import distinct_measurements, silicon_points

    points = [p for p in distinct_measurements(silicon_points(str(HERE / "silicon_runs.json"))) if _selected(p)
              and (_name(p), p["weights"]) in AIC_MODEL]
    with Pool(2) as pool:
        rows = pool.map(_row, points, chunksize=4)
    groups: dict[tuple, dict[int, list[tuple[float, float]]]] = {}
    for r in rows:
        if r["aic_tpot_ms"] is None or r["tfcalc_tpot_ms"] is None:
            continue
        key = (r["engine"], _name(r), r["gpu"], r["weights"].split(",")[0])
        groups.setdefault(key, {}).setdefault(r["tp"], []).append(
            (r["aic_tpot_ms"] / r["tpot_ms"] - 1, r["tfcalc_tpot_ms"] / r["tpot_ms"] - 1))
    print(f"{sum(r['aic_tpot_ms'] is not None and r['tfcalc_tpot_ms'] is not None for r in rows)} of {len(rows)} "
          "runs priced by both; median TPOT error (aiconfigurator / tfcalc) by tp")
    drifts = []
    for key in sorted(groups):
        by_tp = groups[key]
        cells = []
        for tp in sorted(by_tp):
            aic = statistics.median(e[0] for e in by_tp[tp])
            ours = statistics.median(e[1] for e in by_tp[tp])
            cells.append(f"tp {tp} ({len(by_tp[tp])}): {aic:+.0%} / {ours:+.0%}")
        low, high = min(by_tp), max(by_tp)
        if high > low:
            drift = [statistics.median(e[i] for e in by_tp[high]) - statistics.median(e[i] for e in by_tp[low])
                     for i in (0, 1)]
            drifts.append(drift)
            cells.append(f"tp {low} -> {high}: {drift[0]:+.0%} / {drift[1]:+.0%}")
        print(f"{' '.join(key)}: " + "; ".join(cells))
    if drifts:
        print(f"median change from the smallest to the largest tp over {len(drifts)} groups: aiconfigurator "
              f"{statistics.median(d[0] for d in drifts):+.0%}, tfcalc {statistics.median(d[1] for d in drifts):+.0%}; "
              f"median size of the change: {statistics.median(abs(d[0]) for d in drifts):.0%} and "
              f"{statistics.median(abs(d[1]) for d in drifts):.0%}")


if __name__ == "__main__":
    main()
