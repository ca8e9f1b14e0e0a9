"""tfcalc estimate against published measurements and NVIDIA aiconfigurator's predictions: the table in
docs/estimate-validation.md.

    python benchmarks/validation/validate.py [--markdown]

Reference points (each with its source and setting):
- public_points.json: gpt-fast README decode rates, TensorRT-LLM v0.5 first-token latencies (static batches);
  a point may give ``e2e_ms`` instead, a static batch's whole latency as a harness times it (vLLM's
  benchmark_latency, TensorRT-LLM's gptSessionBenchmark: one prefill, then gen - 1 decode steps), compared with
  tfcalc's TTFT + (gen - 1) x TPOT on a line of its own ("E2E"); an optional ``note`` says how a published figure
  was converted (not read) and ``engine_version`` which release ran it (2025-2026 points): a vLLM point whose
  version is a release (``0.19.1``) is priced with the vLLM preset whose ``releases`` cover it (``engine_preset``),
  a build named otherwise (``main + #43135``) with the default preset; a model may be a config.json fixture's
  path;
- silicon_points.json: measured serving runs at concurrency <= 4 from aiconfigurator's silicon_sample.csv
  (TPOT ~ the decode step at that batch, context prompt + gen/2; TTFT is compared with one prompt's prefill, but
  adds request handling and queueing a step model does not price, so it is shown and not counted); the KV cache
  is fp8 on the per-tensor fp8 and NVFP4 runs (NVIDIA ModelOpt checkpoints declaring it, which those engine
  versions follow: silicon_runs.py), bf16 elsewhere;
- aiconfigurator_*.json: aiconfigurator 0.12 static-batch predictions from its measured kernel tables
  (benchmarks/validation/aiconfigurator_points.py writes them); aiconfigurator_large_batch.json holds batches of
  128-512 (``--large-batch``), summarised on their own ("aic b128+") and left out of the other lines, which
  are the issue's batch 1-64 table; aiconfigurator_holdout.json (``--holdout``) holds points collected before the
  twenty-first round's changes on settings no earlier file has (B200 for more models, expert parallelism, 8k
  prompts), summarised on their own too ("aic held-out"; held out at its first scoring only), and
  aiconfigurator_holdout2.json (``--holdout2``) a second grid collected after that round ("aic held-out 2"), and
  aiconfigurator_holdout3.json (``--holdout3``) a third collected before the twenty-second round's changes ("aic
  held-out 3"), aiconfigurator_holdout4.json (``--holdout4``) a fourth before the twenty-third round's ("aic
  held-out 4"), aiconfigurator_holdout5.json (``--holdout5``) a fifth before the twenty-fourth round's ("aic
  held-out 5"), aiconfigurator_holdout6.json (``--holdout6``) a sixth before the twenty-fifth round's ("aic
  held-out 6"), aiconfigurator_holdout7.json (``--holdout7``) a seventh before the twenty-sixth round's ("aic
  held-out 7"), aiconfigurator_holdout8.json (``--holdout8``) an eighth before the twenty-seventh round's ("aic
  held-out 8"), aiconfigurator_holdout9.json (``--holdout9``) a ninth before the twenty-eighth round's ("aic
  held-out 9"), aiconfigurator_holdout10.json (``--holdout10``) a tenth before stop 44's changes ("aic held-out
  10"), aiconfigurator_holdout11.json (``--holdout11``) an eleventh before stop 45's ("aic held-out 11"),
  aiconfigurator_holdout12.json (``--holdout12``) a twelfth after it ("aic held-out 12") and
  aiconfigurator_holdout13.json (``--holdout13``) a thirteenth of models no earlier file has, before stop 46's
  changes ("aic held-out 13"), aiconfigurator_holdout14.json (``--holdout14``) a fourteenth of small models
  among others ("aic held-out 14"), aiconfigurator_holdout15.json (``--holdout15``) a fifteenth with pipeline
  parallelism ("aic held-out 15"), aiconfigurator_holdout16.json (``--holdout16``) a sixteenth with pipeline
  parallelism for MoE models ("aic held-out 16"), aiconfigurator_holdout17.json (``--holdout17``) a seventeenth
  of NVFP4 on the B200 ("aic held-out 17"), aiconfigurator_holdout18.json (``--holdout18``) an eighteenth of
  MiniMax-M2.5, before stop 47's changes ("aic held-out 18"), aiconfigurator_holdout19.json (``--holdout19``) a
  nineteenth of NVFP4 experts on the B200 after its first ("aic held-out 19"), aiconfigurator_holdout20.json
  (``--holdout20``) a twentieth of Qwen3.5's hybrid models ("aic held-out 20"), aiconfigurator_holdout21.json
  (``--holdout21``) a twenty-first of Qwen3-VL's checkpoints ("aic held-out 21") and aiconfigurator_holdout22.json
  (``--holdout22``) a twenty-second of Gemma 4 ("aic held-out 22"), ... and aiconfigurator_holdout35.json
  (``--holdout35``) a thirty-fifth of Kimi K3, MiniMax-M3 and Llama-3.3-Nemotron-Super-49B ("aic held-out 35") and
  aiconfigurator_holdout36.json (``--holdout36``) a thirty-sixth of presets no earlier file has and the A100 ("aic
  held-out 36") and aiconfigurator_holdout37.json (``--holdout37``) a thirty-seventh of the LLAMA-family presets
  left after it, the L40S and RTX PRO 6000 ("aic held-out 37"); a point's model is a preset, a file in
  benchmarks/validation/models, or else the config.json fixture of that name in tests/fixtures/hf_configs (Kimi K3,
  which has no preset).
tfcalc runs with the engine preset the reference used (vllm, sglang, trtllm, gpt-fast; for vLLM the release's
preset where the point names a release, aiconfigurator's points the release of their vLLM tables), its GPU preset
and defaults: nothing is tuned per point. Errors are tfcalc / reference - 1.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LARGE = "aic b128+"
FIXTURES = ROOT / "tests" / "fixtures" / "hf_configs"
# The held-out files, aiconfigurator_holdout.json, aiconfigurator_holdout2.json ... (aiconfigurator_points.py
# --holdoutN), each summarised on its own line
HELD_OUT_FILES = 37


def holdout(n: int) -> str:
    """The source kind of the n-th held-out file: "aic held-out", "aic held-out 2", ..."""
    return "aic held-out" if n == 1 else f"aic held-out {n}"


HOLDOUT = holdout(1)
HOLDOUTS = tuple(holdout(n) for n in range(1, HELD_OUT_FILES + 1))
SOURCES = [("public", HERE / "public_points.json"), ("silicon", HERE / "silicon_points.json"),
           ("aiconfigurator", HERE / "aiconfigurator_vllm.json"),
           ("aiconfigurator", HERE / "aiconfigurator_other.json"),
           (LARGE, HERE / "aiconfigurator_large_batch.json"),
           *((holdout(n), HERE / f"aiconfigurator_holdout{n if n > 1 else ''}.json")
             for n in range(1, HELD_OUT_FILES + 1))]
AIC_GPU = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300", "gb200": "gb200",
           "gb300": "gb300", "a100_sxm": "a100-80gb",  # a100_sxm.yaml: mem_capacity 80 GiB
           # rtx_pro_6000_server.yaml: sm_version 120, mem_capacity 97,887 MiB (the Server Edition's nvidia-smi total)
           "l40s": "l40s", "rtx_pro_6000_server": "rtx-pro-6000"}
# aiconfigurator points whose kernel-table rows no engine would time (aic_caveats.py writes the file and says why:
# "routing", the collector's tied group-limited top-k; "sliced", a row slower than the same experts on half the GPUs;
# "unsplit", rows at ep 2 no faster than at ep 1: SGLang's collector computes the timed rank's remote rows;
# "interpolated", a decode step priced between two rows across which the power-law workload changes its loads;
# "older", a layout the engine version's table lacks, filled from an earlier version whose kernel times differ;
# "extrapolated", a prefill beyond the table's last row scaled from that row where it is lighter than its neighbour;
# "kda_conv", a KDA prefill convolution row that times the collector's host path, not the kernel; "min_latency", a
# TensorRT-LLM NVFP4 decode priced from its opt-in min-latency MoE rows; "double_reduce", a vLLM DeepSeek-family point
# at tp > 1 priced with four all-reduces per layer; "gdn_tp_table", a
# TensorRT-LLM Gated DeltaNet point at tp > 1 whose scan rows are SGLang's, the engine's table holding tp 1's heads)
CAVEATS = HERE / "aiconfigurator_caveats.json"
_CAVEAT_KEY = ("source", "model", "gpu", "backend", "tp", "ep", "batch", "isl", "osl", "weights_dtype")
# aiconfigurator prices MoE layers with its power-law workload (config.py workload_distribution "power_law"):
# exponent 1.01 for DeepSeek-family models (sdk/models/deepseek.py) and Gemma 4 (sdk/models/gemma4.py), 1.2 for the
# others (sdk/models/moe.py)
AIC_ROUTING_ALPHA = {"deepseek-v3": 1.01, "kimi-k2": 1.01, "kimi-k2.5": 1.01, "gemma4-26b-a4b": 1.01,
                     "deepseek-v3.2": 1.01, "glm-5": 1.01, "nemotron-3-nano-30b-a3b": 1.01,
                     "nemotron-3-super-120b-a12b": 1.01, "mimo-v2-flash": 1.01, "deepseek-v4-flash": 1.01,
                     "kimi-k3": 1.01, "minimax-m3": 1.01}  # sdk/models/kimi_k3.py, minimax_m3.py: power_law_1.01
# aiconfigurator's vLLM GEMM collector times block-fp8 linears without CUDA graphs (collector/vllm/collect_gemm.py
# use_cuda_graph=gemm_type != "fp8_block"), so its vLLM predictions carry each such linear's host time: priced here
# with those linears outside the graphs (presets/engines/vllm-0.21.yaml kernels.linear_host_us)
AIC_UNCAPTURED_LINEARS = {"vllm": frozenset({"fp8_block"})}
# What aiconfigurator's `fp8` GEMM mode adds to a GEMM row, per engine (its quantize tables' computescale): a
# per-tensor dynamic scale on TensorRT-LLM (a torch max reduction, 7.4 us on an H100: tfcalc's `dynamic`); a
# per-token one fused with the cast on vLLM (1.2 us more than static; nearest: `static`); nothing on SGLang (zeros).
AIC_FP8_SCALES = {"trtllm": "dynamic", "vllm": "static", "sglang": "static"}
# The checkpoints whose attention aiconfigurator keeps in 16 bits whatever its gemm mode: its DeepSeek-family model
# reads each attention projection's format from the checkpoint's quantization_config (sdk/models/deepseek.py
# attention_projection_exclusions; NVIDIA's Kimi K2.5 NVFP4 "ignore"s every layer's self_attn), its MLA module rows
# keyed bf16
AIC_BF16_ATTENTION = frozenset({"nvidia/Kimi-K2.5-NVFP4"})
MOE = {"mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "gpt-oss-20b",
       "deepseek-v3", "qwen3-coder-480b", "kimi-k2", "kimi-k2.5", "minimax-m2.5", "qwen3.5-35b-a3b",
       "qwen3.5-397b-a17b", "qwen3-vl-30b-a3b", "qwen3-vl-235b-a22b", "gemma4-26b-a4b", "mimo-v2-flash",
       "deepseek-v3.2", "glm-5", "nemotron-3-nano-30b-a3b", "nemotron-3-super-120b-a12b", "deepseek-v4-flash",
       "kimi-k3", "minimax-m3", "qwen3.5-122b-a10b", "minimax-m2.7"}


def load_points() -> list[dict]:
    caveats = {tuple(c[k] for k in _CAVEAT_KEY): c["caveat"] for c in json.loads(CAVEATS.read_text())}
    points = []
    for kind, path in SOURCES:
        if not path.exists():
            continue
        for p in json.loads(path.read_text()):
            if "error" in p:
                continue
            if kind in ("aiconfigurator", LARGE, *HOLDOUTS):
                model = p["model"]
                caveat = caveats.get(tuple({**p, "source": path.name, "ep": p.get("ep", 1)}[k] for k in _CAVEAT_KEY))
                p = {"reference": f"aiconfigurator 0.12 static prediction, {p['backend']} {p.get('version', '')}",
                     "kind": "predicted", "engine": p["backend"], "engine_version": p.get("version") or "",
                     "model": model_file(model),
                     "gpu": AIC_GPU[p["gpu"]],
                     "weights": (f"default={p['weights_dtype']},attention=bf16"
                                 if p.get("aic_model") in AIC_BF16_ATTENTION else p["weights_dtype"]),
                     "kv": p.get("kv", "bf16"), "tp": p["tp"], "ep": p.get("ep", 1),
                     "pp": p.get("pp", 1),
                     "batch": p["batch"],
                     "prompt": p["isl"], "gen": p["osl"], "ttft_ms": p["ttft_ms"], "tpot_ms": p["tpot_ms"],
                     "routing": f"power-law:{AIC_ROUTING_ALPHA.get(model, 1.2)}",
                     "uncaptured_linears": sorted(AIC_UNCAPTURED_LINEARS.get(p["backend"], ())),
                     "fp8_scales": AIC_FP8_SCALES.get(p["backend"], "auto") if p["weights_dtype"] == "fp8" else
                     "auto", "one_format": True, **({"caveat": caveat} if caveat else {})}
            elif kind == "silicon":  # the runs served calibrated checkpoints (ModelOpt: static input scales)
                p = {**p, "fp8_scales": "static"}
            if p["engine"] == "gpt-fast" and p["weights"] not in ("bf16", "fp16"):
                # gpt-fast's quantize.py turns every nn.Linear into its int8 / int4 kind, the output head included
                # (the MoE router excepted); tfcalc's plain `int8` keeps lm_head in 16 bits as checkpoints ship
                p["weights"] = f"default={p['weights']},lm_head={p['weights']}"
            p["source_kind"] = kind
            points.append(p)
    return points


def model_file(model: str) -> str:
    """A model without a preset: its file in benchmarks/validation/models (a YAML spec, or the config.json that
    aiconfigurator bundles, read as a user's would be); else the preset's name; else, for a name no preset has, the
    config.json fixture of that name in tests/fixtures/hf_configs (aiconfigurator's bundled copy, verbatim)."""
    from tfcalc.spec.presets import find_preset

    for suffix in (".yaml", ".json"):
        if (HERE / "models" / f"{model}{suffix}").exists():
            return f"benchmarks/validation/models/{model}{suffix}"
    if find_preset("model", model) is None and (FIXTURES / f"{model}.json").exists():
        return str((FIXTURES / f"{model}.json").relative_to(ROOT))
    return model


def load_spec(model: str):
    """The ModelSpec of a point's model: a preset, a YAML spec or a Hugging Face config.json (paths from the root)."""
    from tfcalc.spec.hf_config import load_hf_config
    from tfcalc.spec.presets import load_model

    if model.endswith(".json"):
        return load_hf_config(ROOT / model, name=Path(model).stem)
    return load_model(str(ROOT / model) if model.endswith(".yaml") else model)


def _model_name(point: dict) -> str:
    """A preset's name, or a model file's stem (``llama3.1-8b`` is a name: its ".1-8b" is no file suffix)."""
    model = str(point["model"])
    return Path(model).stem if model.endswith((".yaml", ".yml", ".json")) else model


_RELEASE = re.compile(r"\d+\.\d+(\.\d+)?")


def engine_preset(p: dict) -> str:
    """The engine preset that prices a point: for vLLM, the preset whose ``releases`` cover the point's
    ``engine_version`` when that is a release number (``0.19.1``, ``0.24.0``), else the engine's default."""
    version = str(p.get("engine_version") or "")
    if p["engine"] != "vllm" or not _RELEASE.fullmatch(version):
        return p["engine"]
    return _release_preset(p["engine"], version)


@functools.cache
def _release_preset(engine: str, version: str) -> str:
    """The name of ``engine``'s preset whose ``releases`` cover ``version`` (presets.load_engine's choice)."""
    from tfcalc.spec.presets import engine_family, load_engine, load_preset_document, preset_names

    releases = load_engine(f"{engine}@{version}").releases
    return next(n for n in preset_names("engine") if engine_family(n) == engine
                and str(load_preset_document("engine", n).get("releases", "")) == releases)


@functools.cache
def _kernels(preset: str):  # -> tfcalc.spec.engine.EngineKernels
    """An engine preset's kernels block, loaded once."""
    from tfcalc.spec.presets import load_engine

    return load_engine(preset).kernels


def predict(p: dict) -> tuple[float, float]:
    """(TTFT, TPOT) in ms from tfcalc with the point's engine, GPU and parallelism."""
    return predict_all(p)[:2]


def predict_all(p: dict) -> tuple[float, float, float]:
    """(TTFT, TPOT, end-to-end latency of the static batch) in ms: e2e = prefill + (gen - 1) decode steps."""
    from tfcalc.calc.kernels import parse_routing
    from tfcalc.calc.kv_cache import default_kv_dtype
    from tfcalc.calc.latency import deployment, estimate_latency
    from tfcalc.dtypes import get_dtype, parse_weight_precision
    from tfcalc.spec.presets import load_gpu

    spec, gpu = load_spec(p["model"]), load_gpu(p["gpu"])
    if p.get("one_format"):  # aiconfigurator quantises every GEMM in its one gemm_quant_mode, from the model's
        spec = replace(spec, quantized_weight_exceptions=())  # bf16 config: no layer kept 16-bit (Llama 3.1 405B)
    precision = parse_weight_precision(p["weights"])
    kv = get_dtype(p["kv"]) if p.get("kv") else default_kv_dtype(spec)
    engine = _kernels(engine_preset(p))
    if p.get("uncaptured_linears"):
        engine = replace(engine, uncaptured_linears=frozenset(p["uncaptured_linears"]))
    d = deployment(spec, gpu, precision, kv, tp=p["tp"], pp=p.get("pp", 1), ep=p.get("ep", 1), engine_kernels=engine,
                   routing=parse_routing(p.get("routing", "uniform")), fp8_scales=p.get("fp8_scales", "auto"))
    pp = p.get("pp", 1)
    # aiconfigurator's static pipeline: its batch is one microbatch, pp of them in flight (its throughput x pp_size,
    # sdk/backends/base_backend.py), and its TTFT that microbatch's trip through every stage (no pipeline fill)
    e = estimate_latency(d, p["batch"] * pp, p["prompt"], max(p["gen"], 2))
    ttft = e.ttft_s if pp == 1 else e.prefill.step.seconds
    if p.get("kind") == "measured-serving":  # a server prefills each arriving prompt on its own
        ttft = estimate_latency(d, 1, p["prompt"], max(p["gen"], 2)).ttft_s
    e2e = e.e2e_s if p["gen"] >= 2 else estimate_latency(d, p["batch"] * pp, p["prompt"], 1).e2e_s
    return ttft * 1e3, e.tpot_s * 1e3, e2e * 1e3


def _err(pred: float, ref: float | None) -> float | None:
    return None if ref is None else pred / ref - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the per-point table as markdown")
    args = parser.parse_args()
    points = load_points()
    rows = []
    for p in points:
        ttft, tpot, e2e = predict_all(p)
        row = {**p, "preset": engine_preset(p), "tfcalc_ttft_ms": ttft, "tfcalc_tpot_ms": tpot, "tfcalc_e2e_ms": e2e,
               "ttft_err": _err(ttft, p.get("ttft_ms")), "tpot_err": _err(tpot, p.get("tpot_ms")),
               "e2e_err": _err(e2e, p.get("e2e_ms"))}
        rows.append(row)
    if args.markdown:
        print("| source | model | GPU | engine preset | weights | tp | ep | batch | prompt | gen | TTFT ref "
              "| TTFT tfcalc | err | TPOT ref | TPOT tfcalc | err |")
        print("|---|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for r in rows:
            if r.get("e2e_ms") and not (r.get("ttft_ms") or r.get("tpot_ms")):
                continue  # in the end-to-end table below
            model = _model_name(r)
            ttft = (f"{r['ttft_ms']:.1f} | {r['tfcalc_ttft_ms']:.1f} | {r['ttft_err']:+.0%}" if r.get("ttft_ms")
                    else "— | " + f"{r['tfcalc_ttft_ms']:.1f} | —")
            tpot = (f"{r['tpot_ms']:.2f} | {r['tfcalc_tpot_ms']:.2f} | {r['tpot_err']:+.0%}" if r.get("tpot_ms")
                    else "— | " + f"{r['tfcalc_tpot_ms']:.2f} | —")
            source = r["source_kind"] + (f" [{r['caveat']}]" if r.get("caveat") else "")
            print(f"| {source} | {model} | {r['gpu']} | {r['preset']} | {r['weights'].replace('=', ':')} | "
                  f"{r['tp']}{f' pp {pp}' if (pp := r.get('pp', 1)) > 1 else ''} | {r.get('ep', 1)} | {r['batch']} | "
                  f"{r['prompt']} | {r['gen']} | {ttft} | {tpot} |")
        print("\nStatic batches timed end to end (TTFT + (gen - 1) x TPOT):\n")
        print("| source | model | GPU | engine preset | weights | KV | tp | batch | prompt | gen | E2E ref (ms) "
              "| E2E tfcalc | err |")
        print("|---|---|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|")
        for r in rows:
            if r.get("e2e_ms"):
                print(f"| {r['source_kind']} | {_model_name(r)} | {r['gpu']} | {r['preset']} | {r['weights']} | "
                      f"{r.get('kv', '')} | {r['tp']} | {r['batch']} | {r['prompt']} | {r['gen']} | "
                      f"{r['e2e_ms']:.0f} | {r['tfcalc_e2e_ms']:.0f} | {r['e2e_err']:+.0%} |")
    summary(rows, "tfcalc", "ttft_err", "tpot_err")


def summary(rows: list[dict], label: str, ttft_key: str, tpot_key: str) -> None:
    print(f"\n{label}:")
    large = [r for r in rows if r["source_kind"] == LARGE]
    held_out = {kind: [r for r in rows if r["source_kind"] == kind] for kind in HOLDOUTS}
    rows = [r for r in rows if r["source_kind"] not in (LARGE, *HOLDOUTS)]
    groups = {"all": rows, "all, no caveat": [r for r in rows if not r.get("caveat")]}
    for kind in ("public", "silicon", "aiconfigurator"):
        groups[kind] = [r for r in rows if r["source_kind"] == kind]
    groups["aic, no caveat"] = [r for r in groups["aiconfigurator"] if not r.get("caveat")]
    for engine in ("vllm", "sglang", "trtllm", "gpt-fast"):
        groups[f"engine {engine}"] = [r for r in rows if r["engine"] == engine]
    groups["dense"] = [r for r in rows if _model_name(r) not in MOE]
    groups["MoE"] = [r for r in rows if _model_name(r) in MOE]
    for model in sorted({_model_name(r) for r in rows}):
        groups[model] = [r for r in rows if _model_name(r) == model]
    groups[LARGE] = large
    for engine in ("vllm", "sglang", "trtllm"):
        groups[f"{LARGE} {engine}"] = [r for r in large if r["engine"] == engine]
    for kind, points in held_out.items():
        groups[kind] = points
        groups[f"{kind}, no caveat"] = [r for r in points if not r.get("caveat")]
        for engine in ("vllm", "sglang", "trtllm"):
            groups[f"{kind} {engine}"] = [r for r in points if r["engine"] == engine]
        groups[f"{kind} dense"] = [r for r in points if _model_name(r) not in MOE]
        groups[f"{kind} MoE"] = [r for r in points if _model_name(r) in MOE]
    everything = [*rows, *large, *(r for points in held_out.values() for r in points)]
    for caveat in ("routing", "sliced", "unsplit", "interpolated", "older", "extrapolated", "dsa_extrapolated",
                    "ssm_unmeasured", "untuned", "msa_disordered", "msa_extrapolated", "kda_conv", "min_latency",
                    "double_reduce", "gdn_tp_table"):
        groups[f"caveat: {caveat}"] = [r for r in everything if r.get("caveat") == caveat]
    for name, rs in groups.items():
        parts = []
        for metric, key in (("TTFT", ttft_key), ("TPOT", tpot_key), ("E2E", "e2e_err")):
            errs = [abs(r[key]) for r in rs if r.get(key) is not None and not (
                metric == "TTFT" and r["source_kind"] == "silicon")]
            if errs:
                parts.append(f"{metric} {sum(e <= 0.2 for e in errs)}/{len(errs)} within 20 % (median |err| "
                             f"{statistics.median(errs):.0%}, worst {max(errs):.0%})")
        if parts:
            print(f"  {name:<20} " + "; ".join(parts))


if __name__ == "__main__":
    main()
