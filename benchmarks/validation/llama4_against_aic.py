"""Llama 4 Scout / Maverick: tfcalc against aiconfigurator 0.12's model of them (a diagnostic, not a held-out grid).

aiconfigurator prices Llama 4 as its HYBRIDMOE family, which departs from the checkpoint in three ways
(sdk/utils.py, sdk/models/hybrid_moe.py): no shared expert ("hybrid-family checkpoints model none"), no all-reduce
on its dense layers (Maverick's even layers), and local / global attention alternating 1:1 instead of three chunked
layers to each NoPE one (no effect below 8,192 tokens). So each point is priced twice: the real model, and the model
without its shared expert; and aiconfigurator's time is shown again with the all-reduces its dense layers lack added
at the price it gives its MoE layers' own two (its pre- and post-dispatch ops, scaled by dense / MoE layers).

    /tmp/aic/bin/python benchmarks/validation/llama4_against_aic.py   # aiconfigurator and tfcalc installed; ~1 min
"""

from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiconfigurator_points as ap  # noqa: E402
import validate as v  # noqa: E402

GRID = [  # (aiconfigurator's bundled config, tfcalc preset, GPU, tps, batches, (isl, osl))
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "llama4-scout-17b-16e", "h200_sxm", [2, 4], [1, 8, 32], (2000, 300)),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", "llama4-maverick-17b-128e", "h200_sxm", [8], [1, 8, 32],
     (2000, 300)),
]
GPUS = {"h200_sxm": "h200", "h100_sxm": "h100-sxm", "b200_sxm": "b200"}


def _without_shared_expert(load):  # noqa: ANN001, ANN202 - wraps validate.load_spec
    def load_spec(model: str):  # noqa: ANN202 - ModelSpec
        s = load(model)
        return replace(s, moe=replace(s.moe, num_shared_experts=0, shared_expert_intermediate_size=0))
    return load_spec


def main() -> None:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    from aiconfigurator.cli.api import cli_estimate

    real = v.load_spec
    print("model     engine  tp  batch  aic TTFT ms  aic TPOT ms | tfcalc TTFT, TPOT | without shared expert "
          "| against aic + all-reduces")
    for path, name, system, tps, batches, (isl, osl) in GRID:
        folder = ap._local_config(path)
        for backend in ("vllm", "sglang", "trtllm"):
            for tp in tps:
                for batch in batches:
                    r = cli_estimate(folder, system, mode="static", backend_name=backend, isl=isl, osl=osl,
                                     batch_size=batch, tp_size=tp, pp_size=1, gemm_quant_mode="bfloat16",
                                     kvcache_quant_mode="bfloat16", moe_tp_size=tp, moe_ep_size=1,
                                     moe_quant_mode="bfloat16")
                    ttft, tpot = r.raw["ttft"], r.raw["tpot"]
                    spec = real(name)
                    dense_per_moe = (spec.num_layers - spec.num_moe_layers) / spec.num_moe_layers
                    fixed = []
                    for ops in (r.summary.get_context_latency_dict(), r.summary.get_generation_latency_dict()):
                        comm = sum(t for op, t in ops.items() if "dispatch" in op)
                        fixed.append(1 + comm * dense_per_moe / sum(ops.values()))
                    point = {"model": name, "gpu": GPUS[system], "engine": backend, "weights": "bf16", "kv": "bf16",
                             "tp": tp, "batch": batch, "prompt": isl, "gen": osl}
                    v.load_spec = real
                    t1, d1 = v.predict(point)
                    v.load_spec = _without_shared_expert(real)
                    t2, d2 = v.predict(point)
                    v.load_spec = real
                    print(f"{name.split('-')[1]:9} {backend:7} {tp:2} {batch:6} {ttft:12.1f} {tpot:12.2f} | "
                          f"{t1 / ttft - 1:+6.0%} {d1 / tpot - 1:+6.0%}    | "
                          f"{t2 / ttft - 1:+6.0%} {d2 / tpot - 1:+6.0%}"
                          f"         | {t1 / ttft / fixed[0] - 1:+6.0%} {d1 / tpot / fixed[1] - 1:+6.0%}",
                          flush=True)


if __name__ == "__main__":
    main()
