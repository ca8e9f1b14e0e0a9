"""Where a closed loop's time goes: NVIDIA's measured serving runs (silicon_runs.json) against tfcalc's step model,
split into prefill and decode.

A closed loop of C clients keeps the GPU busy, so a request holds it for (mean TTFT + (gen - 1) x mean TPOT) / C.
Per engine, data set prefix and tp, this fits that time, over the runs at every prompt length, output length and
concurrency, as a x tfcalc's prefill of one prompt + b x the request's share of its decode steps (gen x the step
at C sequences and the mean context / C), by least squares, and prints a, b and the rms relative residual.
a = b = 1 is tfcalc's own accounting; a > 1 says prefill costs more than priced, b > 1 decode. No aiconfigurator
needed:

    python benchmarks/validation/request_time_fit.py Qwen_Qwen3-32B trtllm
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from capacity_validation import served  # noqa: E402

from tfcalc.calc.serving_inputs import latency_step  # noqa: E402

RUNS = Path(__file__).parent / "silicon_runs.json"


def request_terms(run: dict) -> tuple[float, float, float]:
    """(measured seconds a request holds the GPU, tfcalc's prefill of its prompt, its share of the decode steps), the
    run served as ``capacity_validation.py --silicon-all`` replays it."""
    spec, gpu, engine, precision, kv = served(run)
    step = latency_step(spec, gpu, precision, kv, tp=run["tp"], ep=run.get("ep", 1), engine=engine)
    clients, prompt, gen = run["concurrency"], run["prompt"], run["gen"]
    held = (run["ttft_ms"] + (gen - 1) * run["tpot_ms"]) / 1e3 / clients
    prefill = step.time(0, 0.0, prompt, 0.0, 1)
    decode = gen * step.time(clients, prompt + gen / 2, 0, 0.0, 0) / clients
    return held, prefill, decode


def fit(rows: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """Least squares held = a x prefill + b x decode: (a, b, rms relative residual)."""
    spp = sum(p * p for _, p, _ in rows)
    sdd = sum(d * d for _, _, d in rows)
    spd = sum(p * d for _, p, d in rows)
    shp = sum(h * p for h, p, _ in rows)
    shd = sum(h * d for h, _, d in rows)
    det = spp * sdd - spd * spd
    a, b = (shp * sdd - shd * spd) / det, (shd * spp - shp * spd) / det
    rms = (sum(((a * p + b * d) / h - 1) ** 2 for h, p, d in rows) / len(rows)) ** 0.5
    return a, b, rms


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: request_time_fit.py DATA_SET_PREFIX ENGINE")
    prefix, engine = sys.argv[1:]
    runs = [r for r in json.loads(RUNS.read_text()) if r["source"].startswith(prefix) and r["engine"] == engine]
    for tp in sorted({r["tp"] for r in runs}):
        rows = [request_terms(r) for r in runs if r["tp"] == tp]
        if len(rows) < 3:
            continue
        a, b, rms = fit(rows)
        print(f"{prefix} {engine} tp {tp}: {len(rows)} runs, held = {a:.2f} x prefill + {b:.2f} x decode share "
              f"(rms {rms:.1%})")


if __name__ == "__main__":
    main()
