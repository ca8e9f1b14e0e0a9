"""tfcalc's serving model against TensorRT-LLM's published throughput tables (docs/capacity.md, "TensorRT-LLM's
published throughput").

Each row of benchmarks/validation/trtllm_perf_overview.json is one `trtllm-bench throughput` result of TensorRT-LLM
1.2's perf-overview.md (output tokens/s per GPU): a model, GPU, layout (TPn, TPn,PPm or DEPn = attention data
parallel over n ranks with the experts over n GPUs), checkpoint format and fixed input / output lengths, every request
queued at once. tfcalc replays it with the engine preset (``trtllm``), the checkpoint's format, ``replica_memory``
at the free fraction 0.95 the doc says it used "in many cases", ``latency_step`` and the discrete-event simulation
(``serving_sim.simulate``, one engine per attention rank in lockstep), with the limits trtllm-bench sets itself:

- max_batch_size and max_num_tokens from its heuristic when neither is given (``trtllm_bench_limits``), then
  max_num_tokens raised to the longest prompt + max_batch_size, chunked prefill off (its default), so a step takes
  whole prompts;
- the scheduler policy GUARANTEED_NO_EVICT (trtllm-bench's --scheduler_policy default): a request is admitted only
  when the pool holds its whole prompt + output, which with fixed lengths caps the running requests at the pool's
  sequences of isl + osl tokens;
- no API server (trtllm-bench drives the LLM API in-process), as capacity_validation's ``--mode latency``;
- the doc's llm_options for every model: ``cuda_graph_config: {enable_padding: true, batch_sizes: [1, 2, 4, ...,
  8192]}``, so a generation-only batch runs the captured graph of the next listed size, the gap filled with dummy
  requests (``GraphPaddedStep``).

Nothing is fitted. Usage: python benchmarks/trtllm_overview_validation.py [--markdown] [--only TEXT] [--requests N]
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from capacity_validation import _overheads, served

from tfcalc.calc.engine import scheduler_defaults
from tfcalc.calc.params import count_params
from tfcalc.calc.serving_inputs import KvShape, StepFunction, StepSource, latency_step, replica_memory
from tfcalc.calc.serving_sim import SimConfig, Workload, simulate
from tfcalc.calc.serving_traffic import LengthDist
from tfcalc.dtypes import WeightPrecision, parse_weight_precision
from tfcalc.errors import UsageError
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec

DATA = Path(__file__).parent / "validation" / "trtllm_perf_overview.json"
KV_FREE_FRACTION = 0.95     # perf-overview.md: "--kv_cache_free_gpu_mem_fraction 0.95" in many cases (default 0.90)
# perf-overview.md, "Preparing a Dataset": requests per ISL/OSL
DOC_REQUESTS = {(1024, 1024): 3000, (8192, 1024): 1500, (1024, 8192): 1500, (32768, 1024): 1000, (1024, 32768): 1000}
# tensorrt_llm/bench/build/tuning.py@04cba88 BYTES_PER_ELEM: bytes per weight / KV element by quantisation
HEURISTIC_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "nvfp4": 0.5}
# perf-overview.md (release/1.2), "Running the Benchmark": every model's llm_options.yml sets
# cuda_graph_config.enable_padding: true with these batch_sizes
DOC_GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)


def graph_batch_sizes(listed: tuple[int, ...], max_batch_size: int, max_num_tokens: int) -> tuple[int, ...]:
    """The decode batch sizes TensorRT-LLM captures: the listed ones up to min(max_batch_size, max_num_tokens),
    then that bound itself where padding is on and a listed size passes it (tensorrt_llm/_torch/pyexecutor/
    model_engine.py _filter_cuda_graph_batch_sizes: "padding to max_cuda_graph_bs is acceptable")."""
    bound = min(max_batch_size, max_num_tokens)
    kept = [b for b in sorted(listed) if b <= bound]
    if any(b > bound for b in listed) and (not kept or kept[-1] != bound):
        kept.append(bound)
    return tuple(kept)


def padded_batch(batch: int, sizes: tuple[int, ...]) -> int:
    """The batch a generation-only step runs: the smallest captured size >= batch, or batch itself above the
    largest (run without a graph) -- cuda_graph_runner.py _get_padded_batch / _round_up_batch_size."""
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if batch > 0 and i < len(sizes) else batch


@dataclass(eq=False, kw_only=True)
class GraphPaddedStep(StepSource):
    """A step source whose generation-only steps run padded CUDA graphs: each of the pp micro-batches is filled
    with dummy requests to its captured size (cuda_graph_runner.py _get_padded_batch adds CUDA_GRAPH_DUMMY_REQUEST_ID
    generation requests of a token or two), priced as that many decoding sequences holding the real ones' KV.
    Steps with a prompt run without graphs (scheduler.py can_run_cuda_graph = not context_requests), unpadded."""

    inner: StepSource
    sizes: tuple[int, ...]
    pp: int = 1
    kv: KvShape
    label: str = ""

    def busy_step(self, decode_context: float, prompt_tokens: float, prefix_tokens: float,
                  tokens_per_decode: float = 1.0, extra_s: float = 0.0) -> StepFunction:
        return self.inner.busy_step(decode_context, prompt_tokens, prefix_tokens, tokens_per_decode, extra_s)

    def time(self, decode_seqs: int, decode_context: float, prefill_tokens: int, prefill_past: float,
             prefill_seqs: int, tokens_per_decode: int = 1) -> float:
        if decode_seqs > 0 and not prefill_tokens:
            padded = padded_batch(math.ceil(decode_seqs / self.pp), self.sizes) * self.pp
            if padded > decode_seqs:
                decode_context, decode_seqs = decode_context * decode_seqs / padded, padded
        return self.inner.time(decode_seqs, decode_context, prefill_tokens, prefill_past, prefill_seqs,
                               tokens_per_decode)


def load() -> dict:
    return json.loads(DATA.read_text())


def rows(only: str = "") -> list[dict]:
    """The table's rows whose model, GPU or layout label contains ``only``, each with its id."""
    out = []
    for r in load()["rows"]:
        layout = f"dp{r['dp']}ep{r['ep']}" if r["dp"] > 1 else f"tp{r['tp']}pp{r['pp']}"
        row = {**r, "id": f"{r['model']} {r['gpu']} {layout} {r['isl']}/{r['osl']}"}
        if only in row["id"]:
            out.append(row)
    return out


def checkpoint_elements(spec: ModelSpec, precision: WeightPrecision) -> float:
    """The element count trtllm-bench reads off a checkpoint's safetensors headers (bench/build/dataclasses.py@04cba88
    ModelConfig.get_param_count: sum(metadata.parameter_count.values()), every dtype alike): a matrix in a sub-byte
    format is stored packed, element_bits / 8 U8 elements per weight, its block scales one element each (NVFP4:
    0.5 + 1/16 per weight); byte and wider formats and the 16-bit vectors one per weight. Priced at the quantisation's
    bytes per element, that is the engine-size bug NVIDIA/TensorRT-LLM PR #13498 (2026-04-27, after 1.2) fixed:
    DeepSeek-V3.2-NVFP4 "buggy=183.70 GB vs fixed=386.54 GB"."""
    total = 0.0
    for component, p in count_params(spec).total.items():
        fmt = precision.for_component(component)
        packed = p.matrix * fmt.element_bits / 8 if fmt.element_bits < 8 else p.matrix
        scales = p.matrix / fmt.block_size if fmt.scale_bits else 0.0
        total += packed + scales + p.vector
    return total


def trtllm_bench_limits(spec: ModelSpec, gpu: GPUSpec, row: dict, engine: object,
                        fraction: float = KV_FREE_FRACTION) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) trtllm-bench runs with when not given them: tensorrt_llm/bench/build/
    tuning.py@04cba88 calc_engine_setting / finetune_setting -- requests = fraction x (GPU memory x tp x pp - params x
    bytes) / (2 x layers x max(tp, kv heads) x head size x KV bytes x (isl + osl)), batch = min(requests, 4096) / pp
    rounded up (64 at least; to 32 below 256, 128 below 1024, else 256), tokens = min(batch x (1 + isl / osl), 32768)
    rounded up (2048 at least; to 256 below 4096, 512 below 8192, else 1024); a format outside its table (gpt-oss's
    MXFP4) takes BuildConfig's 2048 / 8192 (build.py get_benchmark_engine_settings; the engine preset's defaults).
    The params are the checkpoint's safetensors element count (``checkpoint_elements``; ModelConfig.get_param_count),
    not the model's parameters. Then benchmark/utils/general.py@0171265 get_settings: without chunked prefill,
    tokens >= longest prompt + batch."""
    isl, osl, tp, pp = row["isl"], row["osl"], row["tp"] * row["dp"], row["pp"]
    if row["weights"] not in HEURISTIC_BYTES:
        batch, tokens = scheduler_defaults(engine, gpu)
    else:
        # bench/build/dataclasses.py ModelConfig: head_size = config head_dim, else hidden / heads (DeepSeek's
        # config.json has none: 7168 / 128); num_key_value_heads as config.json gives it (128 for DeepSeek)
        head = spec.hidden_size // spec.num_attention_heads if spec.mla is not None else spec.head_dim
        kv_heads = spec.num_attention_heads if spec.mla is not None else spec.num_kv_heads
        gib = float(1 << 30)
        per_token = 2 * spec.num_layers * max(tp, kv_heads) * head * HEURISTIC_BYTES.get(row["kv"], 2.0) / gib
        memory = (gpu.runtime_memory_bytes or gpu.memory_bytes) / gib * tp * pp
        elements = checkpoint_elements(spec, parse_weight_precision(row["weights"]))
        weights = elements * HEURISTIC_BYTES[row["weights"]] / gib
        requests = fraction * (memory - weights) / (per_token * (isl + osl))
        raw_bs = min(requests, 4096) / pp
        raw_tokens = min(raw_bs * (1 + isl / osl), 32768)
        if raw_bs < 256:
            batch = max(64, 32 * math.ceil(raw_bs / 32))
        else:
            batch = (128 if raw_bs < 1024 else 256) * math.ceil(raw_bs / (128 if raw_bs < 1024 else 256))
        if raw_tokens < 4096:
            tokens = max(2048, 256 * math.ceil(raw_tokens / 256))
        else:
            tokens = (512 if raw_tokens < 8192 else 1024) * math.ceil(raw_tokens / (512 if raw_tokens < 8192 else 1024))
    return batch, max(tokens, isl + batch)


def replay(row: dict, requests: int | None = None, padding: bool = True,
           fraction: float = KV_FREE_FRACTION) -> dict:
    """One row through tfcalc: predicted output tokens/s per GPU, or ``fits: False`` with tfcalc's reason;
    ``padding``: the doc's padded CUDA graphs (``GraphPaddedStep``); ``fraction``: the KV free-memory fraction."""
    point = {"model": row["model"], "engine": "trtllm", "weights": row["weights"], "gpu": row["gpu"],
             "kv": row["kv"], "checkpoint_kv": row["kv"] if row["kv"] == "fp8" else None}
    spec, gpu, engine, precision, kv = served(point)
    batch, tokens = trtllm_bench_limits(spec, gpu, row, engine, fraction)
    isl, osl, ranks = row["isl"], row["osl"], row["dp"]
    try:
        memory = replica_memory(spec, gpu, precision, kv, tp=row["tp"], pp=row["pp"], ep=row["ep"], engine=engine,
                                max_model_len=isl + osl, max_num_seqs=batch, max_num_batched_tokens=tokens,
                                gpu_memory_utilization=fraction)
        step = latency_step(spec, gpu, precision, kv, tp=row["tp"], pp=row["pp"], ep=row["ep"], engine=engine)
    except UsageError as exc:
        return {**row, "fits": False, "reason": str(exc)}
    # each of pp micro-batches in flight holds up to max_batch_size (the heuristic divides by pp for it); the
    # simulation's step is all pp of them. GUARANTEED_NO_EVICT: only whole requests (isl + osl) in the pool
    seats = min(batch * row["pp"], memory.max_sequences_at_max_len)
    if not memory.fits or seats < 1:
        return {**row, "fits": False, "reason": memory.reason or "no room for one request", "batch": batch}
    cfg = SimConfig(max_num_seqs=seats, max_num_batched_tokens=tokens * row["pp"],
                    kv_capacity_tokens=memory.kv_capacity_tokens, block_size=memory.block_size,
                    overheads=_overheads(engine, "latency"), policy=replace(engine.scheduler, chunked_prefill=False))
    if padding:
        step = GraphPaddedStep(kv=step.kv, label=step.label, inner=step, pp=row["pp"],
                               sizes=graph_batch_sizes(DOC_GRAPH_BATCH_SIZES, batch, tokens))
    n = requests or DOC_REQUESTS[(isl, osl)]
    n = max(n, 2 * seats * ranks) if requests else n
    load_ = Workload(input_len=LengthDist(kind="fixed", mean=isl), output_len=LengthDist(kind="fixed", mean=osl),
                     num_requests=n, concurrency=n, seed=1)
    start = time.perf_counter()
    sim = simulate(step, cfg, load_, ranks=ranks)
    predicted = sim.output_throughput / row["gpus"]
    return {**row, "fits": True, "batch": batch, "tokens": tokens, "seats": seats, "requests": n,
            "kv_tokens": memory.kv_capacity_tokens, "mean_batch": sim.mean_batch, "predicted": predicted,
            "error": predicted / row["output_tok_s_per_gpu"] - 1, "seconds": time.perf_counter() - start}


def summary(label: str, group: list[dict]) -> str:
    errors = [abs(r["error"]) for r in group]
    signed = statistics.median(r["error"] for r in group)
    inside = sum(e <= 0.25 for e in errors)
    return (f"| {label} | {len(group)} | {inside} ({100 * inside / len(group):.0f} %) | "
            f"{statistics.median(errors) * 100:.0f} % | {signed * 100:+.0f} % |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="the rows whose id (model gpu layout isl/osl) contains this")
    parser.add_argument("--requests", type=int, default=0,
                        help="simulate this many requests a row (at least two full batches) instead of the doc's")
    parser.add_argument("--markdown", action="store_true", help="print the docs/capacity.md tables")
    parser.add_argument("--no-padding", action="store_true",
                        help="every decode batch priced at its own size (no padded CUDA graphs)")
    parser.add_argument("--free-fraction", type=float, default=KV_FREE_FRACTION,
                        help="kv_cache_free_gpu_mem_fraction (trtllm-bench's default: 0.90)")
    args = parser.parse_args()
    start = time.perf_counter()
    results = []
    if args.markdown:
        print("| model | GPU | layout | ISL/OSL | batch / tokens (heuristic) | running (pool) | reported tok/s/GPU | "
              "predicted | error |\n|---|---|---|---|---|---|--:|--:|--:|")
    for row in rows(args.only):
        r = replay(row, args.requests or None, padding=not args.no_padding, fraction=args.free_fraction)
        results.append(r)
        layout = f"DEP{r['dp']}" if r["dp"] > 1 else (f"TP{r['tp']},PP{r['pp']}" if r["pp"] > 1 else f"TP{r['tp']}")
        gpu = r["gpu"] + (" (beta)" if r["beta"] else "")
        if not r["fits"]:
            print(f"| {r['model']} | {gpu} | {layout} | {r['isl']}/{r['osl']} | — | — | "
                  f"{r['output_tok_s_per_gpu']:,} | not run: {r['reason']} | — |" if args.markdown
                  else f"{r['id']:45s} not run: {r['reason']}", flush=True)
            continue
        if args.markdown:
            print(f"| {r['model']} | {gpu} | {layout} | {r['isl']}/{r['osl']} | {r['batch']} / {r['tokens']} | "
                  f"{r['mean_batch']:.0f} ({r['seats']}) | {r['output_tok_s_per_gpu']:,} | {r['predicted']:,.0f} | "
                  f"{r['error'] * 100:+.0f} % |", flush=True)
        else:
            print(f"{r['id']:45s} reported {r['output_tok_s_per_gpu']:7,} predicted {r['predicted']:9,.0f} "
                  f"({r['error'] * 100:+4.0f} %)  batch {r['batch']} tokens {r['tokens']} seats {r['seats']} "
                  f"mean running {r['mean_batch']:.0f}  {r['seconds']:.1f} s", flush=True)
    ran = [r for r in results if r["fits"]]
    print(f"\n{len(ran)} of {len(results)} rows replayed ({len(results) - len(ran)} not run) in "
          f"{time.perf_counter() - start:.0f} s\n")
    if not ran:
        return
    print("| group | rows | within ±25 % | median abs error | median error |\n|---|--:|---|--:|--:|")
    print(summary("all", ran))
    for key in ("gpu", "model"):
        for value in sorted({r[key] for r in ran}):
            print(summary(value, [r for r in ran if r[key] == value]))
    for name, test in (("ISL > OSL", lambda r: r["isl"] > r["osl"]), ("OSL > ISL", lambda r: r["osl"] > r["isl"]),
                       ("ISL = OSL", lambda r: r["osl"] == r["isl"])):
        group = [r for r in ran if test(r)]
        if group:
            print(summary(name, group))


if __name__ == "__main__":
    main()
