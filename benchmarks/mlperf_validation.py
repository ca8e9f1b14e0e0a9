"""tfcalc's serving model against MLPerf Inference server-scenario results (docs/capacity.md, "MLPerf Inference").

Each point (benchmarks/validation/mlperf_server.json) is one published, audited Llama 2 70B Server run with its
Offline run. In Server, LoadGen sends the OpenOrca samples as a Poisson process at the submitter's chosen rate for
at least the run's minimum duration (10 or 40 minutes; the replay simulates the same), and the run is valid only
if the p99 time to first token stays within 2 s and the p99 time per output token within 200 ms. In Offline, all
samples are sent at once (throughput alone). The file gives the system, the parallel layout and batch limit from
the submission's own configuration, and each result's summary (samples/s, output tokens/s, TTFT and TPOT
percentiles), each with its path in mlcommons/inference_results_v4.1.

tfcalc replays each one replica at a time (the submission's replicas each get an equal share of a Poisson stream,
itself Poisson): its discrete-event simulation of continuous batching with the engine preset's scheduler and
memory model and the per-operation latency model of ``estimate``, no API server (LoadGen's SUT runs the engine in
the same process and hands it token ids). Request lengths: the dataset's 24,576 prompt lengths
(benchmarks/validation/openorca_lengths.csv: token counts of MLCommons' open_orca_gpt4_tokenized_llama.sampled_24576,
as extracted by openshift-psap/performance-dashboard@7100702 mlperf-data/summaries/llama2-70b-99.csv; mean 222,
max 1,021) and its reference-answer lengths rescaled to the run's own mean generated length (output tokens/s over
completed samples/s: 290-293; the model writes longer answers than the GPT-4 references, mean 219), capped at
MLPerf's 1,024 new tokens; prompt and output lengths are drawn independently. Nothing is fitted to the results.

The v5.1 points of other benchmarks and of the Interactive scenario carry their own ``lengths_csv`` (token counts
of MLCommons' datasets as extracted by openshift-psap/performance-dashboard@7100702 mlperf-data/summaries/:
llama3-1-8b-datacenter.csv -> cnndm_llama3_lengths.csv, 13,368 CNN-DailyMail prompts, mean 871; llama3-1-405b.csv
-> llama3_405b_lengths.csv, 8,313, mean 9,429; mixtral-8x7b.csv -> mixtral_lengths.csv, 15,000, mean 427),
``max_new_tokens`` (128 for Llama 3.1 8B, whose reference lengths there are characters / 4, so only their shape
is used), ``max_model_len`` and the p99 limits of their LoadGen summary (``ttft_limit_ms``, ``tpot_limit_ms``:
Interactive 450 / 40 ms, 405B 6,000 / 175 ms, 8B 2,000 / 100 ms); ``offline`` is null where the Offline run's
layout is one the replay lacks (pipeline parallelism). ``scheduler`` (SchedulerPolicy's fields) is the run's stated
prefill scheduling where it is not chunked prefill beside decodes (AMD's v5.1 runs: ``scheduler_policy``).

Two comparisons per point. At the reported rate: predicted against measured TTFT and TPOT (p50, p99) and the
sequences in flight per replica (Little's law: completed samples/s x mean latency). And the highest rate at which
tfcalc's simulation still meets the two p99 limits, against the rate the submitter ran (a lower bound of the
system's true capacity: submitters pick a rate that passes).

``--steps`` prices one scheduler step at each run's measured operating point instead (seconds, no simulation): the
sequences in flight per replica (Little's law), each at the mean context of a sequence in flight (mean prompt plus
E[output^2] / (2 E[output]): a sequence is in flight for as many steps as it has output tokens), beside the
prefill tokens that step carries at the run's arrival rate (rate x measured step x mean prompt), against the
measured TPOT p50; and the decode-only step at the same batch. Where NVIDIA aiconfigurator is importable (a scratch
environment, ``pip install aiconfigurator==0.12.0``; not a tfcalc dependency), its static-batch TPOT for
TensorRT-LLM on the same GPU, tp, batch and lengths (its mean decode step over the output, from Llama 2 70B's
config.json) is printed beside them.

Usage: python benchmarks/mlperf_validation.py [--markdown] [--duration S] [--steps]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from functools import cache
from pathlib import Path

from tfcalc.calc.engine import scheduler_defaults
from tfcalc.calc.serving_inputs import latency_step, replica_memory
from tfcalc.calc.serving_sim import SimConfig, SimResult, Workload, simulate
from tfcalc.calc.serving_traffic import LengthDist, Overheads
from tfcalc.cli.capacity import read_lengths_csv
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.engine import SchedulerPolicy
from tfcalc.spec.presets import load_engine, load_gpu, load_model

HERE = Path(__file__).parent / "validation"
TTFT_LIMIT_S, TPOT_LIMIT_S, MAX_NEW_TOKENS = 2.0, 0.2, 1024   # MLPerf Inference v4.1 llama2-70b Server
OPENORCA = "benchmarks/validation/openorca_lengths.csv"


def points(only: str = "") -> list[dict]:
    return [p for p in json.loads((HERE / "mlperf_server.json").read_text()) if only in p["id"]]


def limits(point: dict) -> tuple[float, float]:
    """The run's p99 TTFT and TPOT limits (seconds): its LoadGen summary's ttft_latency / tpot_latency."""
    return point.get("ttft_limit_ms", TTFT_LIMIT_S * 1e3) / 1e3, point.get("tpot_limit_ms", TPOT_LIMIT_S * 1e3) / 1e3


@cache
def _dataset(csv: str = OPENORCA) -> tuple[LengthDist, LengthDist]:
    return read_lengths_csv(HERE.parent.parent / csv)   # the format `tfcalc capacity --lengths-csv` reads


def dataset_lengths(output_mean: float, csv: str = OPENORCA,
                    max_new: int = MAX_NEW_TOKENS) -> tuple[LengthDist, LengthDist]:
    """The dataset's prompt lengths, and its reference-answer lengths scaled by the factor s whose capped
    lengths min(max_new, round(o x s)) have mean ``output_mean`` (bisection; all at the cap where the mean
    reaches it)."""
    inputs, references = _dataset(csv)

    def scaled(scale: float) -> tuple[int, ...]:
        return tuple(max(1, min(max_new, round(o * scale))) for o in references.values)

    lo, hi = 0.0, max_new / min(references.values)       # every length at the cap at ``hi``
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(scaled(mid)) < output_mean * len(references.values) else (lo, mid)
    return inputs, LengthDist(kind="empirical", values=scaled(hi))


def scheduler_policy(point: dict) -> SchedulerPolicy:
    """The run's stated scheduling: chunked prefill beside decodes (TensorRT-LLM enable_chunked_context, as NVIDIA's
    configurations set it) unless the point's ``scheduler`` says otherwise. AMD's v5.1 vLLM 0.9 runs set
    enable_chunked_prefill False, so vLLM V0's Scheduler._schedule_default runs: waiting prompts whole, and no
    decode in a step that has a prompt (vllm-project/vllm@0054e1f vllm/core/scheduler.py)."""
    return SchedulerPolicy(**point.get("scheduler", {}))


class Replica:
    """One engine instance of a point: its step model, scheduler limits and KV pool, with a scenario's sequence
    limit (0: the engine preset's default) and mean generated length."""

    def __init__(self, point: dict, max_num_seqs: int, output_mean: float, budget: int = 0) -> None:
        spec, gpu = load_model(point["model"]), load_gpu(point["gpu"])
        # the submissions' calibrated fp8 checkpoints: static input scales
        spec = replace(spec, native_dtype=point["weights"], checkpoint_activation_scale="static")
        engine = load_engine(point["engine"])
        precision, kv = parse_weight_precision(point["weights"]), get_dtype(point["kv"])
        seats, default_budget = scheduler_defaults(engine, gpu)
        self.seats, self.budget = max_num_seqs or seats, budget or default_budget
        self.replicas = point["gpus"] // point["tp"]
        memory = replica_memory(spec, gpu, precision, kv, tp=point["tp"], pp=1, ep=1, engine=engine,
                                max_model_len=point.get("max_model_len", 2 * MAX_NEW_TOKENS), max_num_seqs=self.seats,
                                max_num_batched_tokens=self.budget)
        self.kv_tokens, self.block_size, self.fits = memory.kv_capacity_tokens, memory.block_size, memory.fits
        self.step = latency_step(spec, gpu, precision, kv, tp=point["tp"], engine=engine)
        self.engine = engine.label
        self.inputs, self.outputs = dataset_lengths(output_mean, point.get("lengths_csv", OPENORCA),
                                                    point.get("max_new_tokens", MAX_NEW_TOKENS))
        self.limits = limits(point)
        self.cfg = SimConfig(max_num_seqs=self.seats, max_num_batched_tokens=self.budget,
                             kv_capacity_tokens=self.kv_tokens, block_size=self.block_size,
                             overheads=Overheads(source="in-process SUT: none"), policy=scheduler_policy(point))

    def run(self, system_qps: float, duration_s: float, seed: int = 1) -> SimResult:
        """Server: a Poisson stream of ``system_qps`` / replicas samples a second into this replica for
        ``duration_s`` (a rate above the replica's capacity shows as a queue that grows over the run)."""
        rate = system_qps / self.replicas
        load = Workload(input_len=self.inputs, output_len=self.outputs, num_requests=max(100, round(rate * duration_s)),
                        rate_per_s=rate, seed=seed, warmup_fraction=0.1)
        return simulate(self.step, self.cfg, load)

    def offline_tok_s(self, seed: int = 1) -> float:
        """Offline: the engine never waits for work (a closed loop of twice its sequence limit, ten times that many
        samples); output tokens/s of all replicas over the whole run."""
        load = Workload(input_len=self.inputs, output_len=self.outputs, num_requests=10 * self.seats,
                        concurrency=2 * self.seats, seed=seed)
        return simulate(self.step, self.cfg, load).output_throughput * self.replicas


def server_replica(point: dict) -> Replica:
    return Replica(point, point["max_num_seqs"], point["output_tok_s"] / point["completed_qps"],
                   point.get("max_num_batched_tokens", 0))


def offline_replica(point: dict) -> Replica:
    off = point["offline"]
    return Replica(point, off["max_num_seqs"], off["output_tok_s"] / off["samples_per_s"],
                   off.get("max_num_batched_tokens", 0))


def meets_limits(sim: SimResult, limit: tuple[float, float] = (TTFT_LIMIT_S, TPOT_LIMIT_S)) -> bool:
    return sim.metric("ttft", 99) <= limit[0] and sim.metric("tpot", 99) <= limit[1]


def max_qps(replica: Replica, start_qps: float, duration_s: float,
            limit: tuple[float, float] = (TTFT_LIMIT_S, TPOT_LIMIT_S)) -> float:
    """The highest system rate (samples/s) whose simulation over the run's duration meets both p99 limits: bisection
    between a rate that meets them and one that does not, to 2 %."""
    lo, hi = start_qps, start_qps
    while meets_limits(replica.run(hi, duration_s), limit):
        lo, hi = hi, hi * 1.15
    while not meets_limits(replica.run(lo, duration_s), limit):
        lo, hi = lo / 1.15, lo
    while hi / lo > 1.02:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if meets_limits(replica.run(mid, duration_s), limit) else (lo, mid)
    return lo


def operating_point(point: dict, replica: Replica) -> dict[str, float]:
    """The measured run's step: sequences in flight per replica, their mean context, prompts and prefill tokens per
    step at the run's rate, and the step itself (TPOT p50, seconds)."""
    rate = point["completed_qps"] / replica.replicas
    step = point["tpot_ms"]["p50"] / 1e3
    outputs = replica.outputs.values
    context = replica.inputs.mean + sum(o * o for o in outputs) / (2 * sum(outputs))
    return {"seqs": round(rate * point["e2e_mean_s"]), "context": context, "prompts": rate * step,
            "prefill_tokens": rate * step * replica.inputs.mean, "step_s": step,
            "output_mean": sum(outputs) / len(outputs)}


_LLAMA2 = "benchmarks/validation/models/llama2-70b.yaml"   # the only model whose config.json is built below
_AIC_SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm"}


def aiconfigurator_tpot_s(point: dict, seqs: int, isl: int, osl: int) -> float | None:
    """aiconfigurator's static-batch TPOT (seconds) for TensorRT-LLM on the point's GPU, or None where it is not
    installed, has no such system or the point's model is not Llama 2 70B."""
    if point["engine"] != "trtllm" or point["gpu"] not in _AIC_SYSTEMS or point["model"] != _LLAMA2:
        return None
    try:
        import logging
        import tempfile
        import warnings

        from aiconfigurator.cli.api import cli_estimate
    except ImportError:
        return None
    import yaml

    spec = yaml.safe_load(Path(point["model"]).read_text())
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": spec["hidden_size"],
              "intermediate_size": spec["intermediate_size"], "num_hidden_layers": spec["num_layers"],
              "num_attention_heads": spec["num_attention_heads"], "num_key_value_heads": spec["num_kv_heads"],
              "head_dim": spec["head_dim"], "vocab_size": spec["vocab_size"],
              "max_position_embeddings": spec["max_context"], "rope_theta": spec["rope_theta"],
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "float16", "hidden_act": "silu"}
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "Llama-2-70b-hf"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        result = cli_estimate(str(folder), _AIC_SYSTEMS[point["gpu"]], mode="static", backend_name="trtllm",
                              isl=isl, osl=osl, batch_size=seqs, tp_size=point["tp"], gemm_quant_mode="fp8",
                              kvcache_quant_mode="fp8")
    return result.raw["tpot"] / 1e3


def print_steps(only: str = "") -> None:
    print("| run | in flight x mean context | + prompts (tokens) a step | step measured ms | tfcalc | decode only, "
          "tfcalc | aiconfigurator static TPOT |\n|---|---|---|---|---|---|---|")
    for point in points(only):
        replica = server_replica(point)
        op = operating_point(point, replica)
        prompts = max(1, round(op["prompts"]))
        mixed = replica.step.time(op["seqs"], op["context"], round(op["prefill_tokens"]), 0.0, prompts)
        decode = replica.step.time(op["seqs"], op["context"], 0, 0.0, 0)
        aic = aiconfigurator_tpot_s(point, op["seqs"], round(replica.inputs.mean), round(op["output_mean"]))
        cells = (point["id"], f"{op['seqs']} x {op['context']:.0f}",
                 f"{op['prompts']:.1f} ({op['prefill_tokens']:.0f})", f"{op['step_s'] * 1e3:.0f}",
                 f"{mixed * 1e3:.0f} ({_pct(mixed, op['step_s'])})", f"{decode * 1e3:.0f}",
                 "—" if aic is None else f"{aic * 1e3:.1f}")
        print("| " + " | ".join(cells) + " |")


def _pct(predicted: float, measured: float) -> str:
    return f"{(predicted / measured - 1) * 100:+.0f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the docs/capacity.md tables")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="simulated seconds per rate (default: the run's own minimum duration, 600-2,400 s)")
    parser.add_argument("--steps", action="store_true",
                        help="price one step at each run's measured operating point (no simulation)")
    parser.add_argument("--only", default="", help="the runs whose id contains this")
    args = parser.parse_args()
    if args.steps:
        print_steps(args.only)
        return
    rows = []
    for point in points(args.only):
        start = time.perf_counter()
        replica = server_replica(point)
        duration = args.duration or point["min_duration_s"]
        sim = replica.run(point["scheduled_qps"], duration)
        best = max_qps(replica, point["scheduled_qps"], duration, replica.limits)
        offline = offline_replica(point).offline_tok_s() if point["offline"] else 0.0
        rows.append((point, replica, sim, best, offline, time.perf_counter() - start))
    if args.markdown:
        print("| run | layout | engine preset | in flight per replica, measured / predicted | TTFT p50 / p99 ms "
              "measured | predicted | TPOT p50 / p99 ms measured | predicted |\n|---|---|---|---|---|---|---|---|")
    for point, replica, sim, _, _, _ in rows:
        per_replica_qps = point["completed_qps"] / replica.replicas   # Little's law: rate x mean time in system
        measured_in_flight = per_replica_qps * point["e2e_mean_s"]
        predicted_in_flight = per_replica_qps * sim.metric("e2e", 0)
        m_ttft, m_tpot = point["ttft_ms"], point["tpot_ms"]
        cells = (point["id"], f"{point['gpus'] // point['tp']} x tp {point['tp']}, {point['weights']} / KV "
                 f"{point['kv']}, {replica.seats} seqs", replica.engine,
                 f"{measured_in_flight:.0f} / {predicted_in_flight:.0f}",
                 f"{m_ttft['p50']:.0f} / {m_ttft['p99']:.0f}",
                 f"{sim.metric('ttft', 50) * 1e3:.0f} / {sim.metric('ttft', 99) * 1e3:.0f}",
                 f"{m_tpot['p50']:.0f} / {m_tpot['p99']:.0f}",
                 f"{sim.metric('tpot', 50) * 1e3:.0f} / {sim.metric('tpot', 99) * 1e3:.0f} "
                 f"({_pct(sim.metric('tpot', 50), m_tpot['p50'] / 1e3)})")
        print("| " + " | ".join(cells) + " |" if args.markdown else "  ".join(cells))
    print()
    if args.markdown:
        print("| run | Server samples/s run (output tok/s) | highest samples/s meeting both p99 limits, predicted "
              "(output tok/s) | vs run | Offline output tok/s measured / predicted |\n|---|---|---|---|---|")
    for point, _, _, best, offline, seconds in rows:
        mean_out = point["output_tok_s"] / point["completed_qps"]
        measured_offline = point["offline"]["output_tok_s"] if point["offline"] else 0.0
        cells = (point["id"], f"{point['scheduled_qps']:.1f} ({point['output_tok_s']:,.0f})",
                 f"{best:.1f} ({best * mean_out:,.0f})", _pct(best, point["scheduled_qps"]),
                 f"{measured_offline:,.0f} / {offline:,.0f} ({_pct(offline, measured_offline)})"
                 if offline else "—")
        print("| " + " | ".join(cells) + " |" if args.markdown else "  ".join(cells) + f"  ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
