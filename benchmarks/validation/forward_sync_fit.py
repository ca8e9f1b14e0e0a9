"""The ``forward_sync_us_per_peer`` of presets/interconnects/nvlink{4,5}.yaml: what each all-reduce inside a decode
step costs beyond the custom all-reduce kernel timed back to back, per peer GPU, from NVIDIA's measured serving runs
(benchmarks/validation/silicon_runs.json; no aiconfigurator needed).

    python benchmarks/validation/forward_sync_fit.py [--jobs 2]

The runs: concurrency <= 8 and >= 1,000 output tokens (one prompt per thousand decode steps: the TPOT is the decode
step's) under vLLM and TensorRT-LLM: Llama 3.1 70B, gpt-oss-120b and Qwen3-32B (two all-reduces per layer) at tp 1-8.
Left out: vLLM 0.12's Qwen3-235B-A22B (its steps run 1.5-2x NVIDIA's own predictor, aiconfigurator, on the same
GPUs: docs/capacity.md), TensorRT-LLM's DeepSeek-V3 (the data set disagrees with itself by 1.7-2.3x, docs/capacity.md)
and SGLang's runs (DeepSeek-V3 and Qwen3-235B-A22B only). Each run is replayed as ``capacity_validation.py
--silicon-all`` replays it, with the presets as they are.

The model of the residual (measured - predicted TPOT) per run: e_g x predicted, one proportional error e_g per
(engine, model, GPU, weight format) -- a kernel rate off by a few per cent scales with the step -- plus
c_f x (tp - 1) x 2 x layers, one c_f per fabric: the per-peer cost of every all-reduce. Least squares over vLLM's runs
gives each fabric's correction to the preset's value (printed; about 0 once the preset holds the fit); TensorRT-LLM's
runs, fitted on their own the same way, are the held-out check. The rms of the residual is printed three ways: with
the per-peer term taken out of the predictions, at the presets, and at the fitted values.
"""

from __future__ import annotations

import argparse
import sys
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MAX_CONCURRENCY = 8
MIN_OUTPUT = 1000


def _selected(point: dict) -> bool:
    model = Path(point["model"]).name
    if point["concurrency"] > MAX_CONCURRENCY or point["gen"] < MIN_OUTPUT or point["engine"] == "sglang":
        return False
    return "qwen3-235b" not in model and model != "deepseek-v3"


def _fit(rows: list[dict], fabrics: list[str], mode: str) -> tuple[dict[str, float], float]:
    """(correction per fabric in us per peer per all-reduce, rms of the residual left) by least squares. ``mode``:
    ``fit`` solves for the corrections; ``preset`` keeps the presets' values (group errors only); ``without`` takes
    the per-peer term out of the predictions first (each decode step carries (tp - 1) x all-reduces x the preset's
    value)."""
    import numpy as np

    groups = sorted({(r["engine"], r["model"], r["gpu"], r["weights"]) for r in rows})
    column = {g: i for i, g in enumerate(groups)}
    a = np.zeros((len(rows), len(groups) + len(fabrics)))
    y = np.zeros(len(rows))
    for i, r in enumerate(rows):
        term = (r["tp"] - 1) * r["all_reduces"] * 1e-3  # us -> ms
        predicted = r["predicted_tpot_ms"] - (term * r["preset_us"] if mode == "without" else 0.0)
        a[i, column[(r["engine"], r["model"], r["gpu"], r["weights"])]] = predicted
        a[i, len(groups) + fabrics.index(r["fabric"])] = term
        y[i] = r["tpot_ms"] - predicted
    if mode != "fit":
        a = a[:, :len(groups)]
    coef = np.linalg.lstsq(a, y, rcond=None)[0]
    rms = float(np.sqrt(np.mean((y - a @ coef) ** 2)))
    return ({f: float(c) for f, c in zip(fabrics, coef[len(groups):], strict=True)} if mode == "fit" else {}), rms


def main() -> None:
    from capacity_validation import _replay, _spec, distinct_measurements, silicon_points

    from tfcalc.spec.interconnect import load_interconnect
    from tfcalc.spec.presets import load_gpu

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    points = [p for p in distinct_measurements(silicon_points("silicon_runs.json")) if _selected(p)]
    with Pool(max(1, args.jobs)) as pool:
        rows = [r for r in pool.map(_replay, points, chunksize=4) if r["fits"]]
    for r in rows:
        r["fabric"] = load_gpu(r["gpu"]).latency.interconnect_preset
        r["all_reduces"] = 2 * _spec(r["model"]).num_layers
    fabrics = sorted({r["fabric"] for r in rows})
    preset_us = {f: load_interconnect(f).forward_sync_s_per_peer * 1e6 for f in fabrics}
    for r in rows:
        r["preset_us"] = preset_us[r["fabric"]]
    for engine, role in (("vllm", "fit"), ("trtllm", "held out")):
        subset = [r for r in rows if r["engine"] == engine]
        here = [f for f in fabrics if any(r["fabric"] == f for r in subset)]
        correction, rms = _fit(subset, here, "fit")
        rms_without, rms_preset = (_fit(subset, here, mode)[1] for mode in ("without", "preset"))
        for fabric, c in correction.items():
            n = sum(r["fabric"] == fabric for r in subset)
            print(f"{engine:7s} ({role}) {fabric}: {n} runs; preset {preset_us[fabric]:.2f} us per peer, "
                  f"least-squares correction {c:+.2f} -> {preset_us[fabric] + c:.2f}")
        print(f"{engine:7s} ({role}) rms of measured - predicted TPOT left by each group's proportional error: "
              f"{rms_without:.3f} ms without the per-peer term, {rms_preset:.3f} ms at the presets, {rms:.3f} ms "
              "with the fitted values")


if __name__ == "__main__":
    main()
