"""``tfcalc plan``: does a model fit on these GPUs, for how many sequences at what context?"""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tfcalc.cli.common import (
    BatchOpt,
    ConfigOpt,
    FormatOpt,
    KvDtypeOpt,
    OutputOpt,
    PresetOpt,
    complete_engine,
    complete_preset,
    fail,
    handle_errors,
    parse_dtype_list,
    resolve_models,
)
from tfcalc.errors import UsageError
from tfcalc.output import emit, emit_explanation, pick, print_stderr, varies, wide
from tfcalc.units import parse_float, parse_sizes, split_list

if TYPE_CHECKING:
    from tfcalc.spec.engine import EngineSpec

GpuOpt = Annotated[list[str], typer.Option(
    "--gpu", "-g", help="GPU preset (see 'tfcalc presets list --kind gpu') or a GPU YAML file; lists compare.",
    autocompletion=complete_preset("gpu"))]
WeightsOpt = Annotated[list[str] | None, typer.Option(
    "--weights-dtype", "-w", help="Weight format(s): bf16, fp8, int4-g128, nvfp4, lists, or per component "
    "(experts=mxfp4,default=bf16); default: the checkpoint's.", show_default=False)]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Also draw a PNG chart here (needs matplotlib).",
                                              show_default=False)]
ExplainOpt = Annotated[bool, typer.Option("--explain", help="Print the formula trace behind each row.")]
EngineOpt = Annotated[list[str] | None, typer.Option(
    "--engine", "-e", help="Engine version: vllm (default; its current version), vllm@0.19 (the one covering a "
    "release), sglang, trtllm, gpt-fast, ideal (plain memory arithmetic), a preset (vllm-0.17) or an engine YAML; "
    "lists compare. Default from $TFCALC_ENGINE, else vllm.", envvar="TFCALC_ENGINE", show_default=False,
    autocompletion=complete_engine)]

COLUMNS = pick("model", "gpu", "engine", "num_gpus", "tp", "pp", varies("ep", "dp"), "context",
               varies("batch", "weights_dtype", "kv_dtype"), "weights_bytes_per_gpu", "kv_budget_bytes_per_gpu",
               "kv_tokens_per_gpu", "max_concurrent_sequences", "fits",
               wide("max_context_at_batch", "capacity_bytes", "reserved_bytes_per_gpu"))
ENGINE_NOTES = {
    "ideal": "ideal: reserved = capacity x (1 - utilization) + runtime overhead + one prefill chunk's activations; "
             "KV budget = capacity - weights - reserved; window caps applied",
    "vllm": "vllm: KV = capacity (as CUDA reports it) x gpu_memory_utilization - weights - torch peak of the "
            "profiling run (forward of max_num_batched_tokens, sampler over max_num_seqs rows of logits) - "
            "non-torch [- CUDA graphs from 0.21]; max seqs = vLLM's 'Maximum concurrency'",
    "sglang": "sglang: KV pool = memory free at start x mem_fraction_static - weights (pool tokens; max seqs = "
              "tokens // context)",
    "trtllm": "trtllm: KV = (capacity - peak of the dry run) x free_gpu_memory_fraction, blocks of 32 tokens",
}


def engine_note(engine: "EngineSpec | None") -> str:
    """The memory model a row's engine stands for, in one sentence (``ENGINE_NOTES``)."""
    if engine is None:
        return ENGINE_NOTES["ideal"]
    if not engine.models_memory:
        return f"{engine.name}: no KV pool of its own to model (its preset says budget: ideal): the ideal arithmetic"
    return ENGINE_NOTES.get(engine.name, engine.name)


def gpu_list(values: list[str]) -> list:
    from tfcalc.spec.presets import load_gpu

    names = [item for value in values for item in split_list(value)]
    if not names:
        raise UsageError("name a GPU: --gpu h100-sxm (see 'tfcalc presets list --kind gpu')")
    return [load_gpu(name) for name in names]


def float_list(values: list[str] | None, what: str, high: float | None = None) -> list[float]:
    return [parse_float(item, what, 0.0, high) for value in values or [] for item in split_list(value)]


def weight_precisions(values: list[str] | None) -> list:
    from tfcalc.cli.memory import parse_weight_dtypes

    return parse_weight_dtypes(values)


def traces_text(rows: list[dict], traces: list[tuple[str, ...]], keys: tuple[str, ...]) -> str:
    """Each row's trace under a ``# key=value, ...`` line naming it."""
    return "".join("\n# " + ", ".join(f"{k}={row[k]}" for k in keys) + "\n" + "".join(f"  {line}\n" for line in trace)
                   for row, trace in zip(rows, traces, strict=True))


def engine_list(values: list[str] | None) -> list:
    """``ideal`` (None: the plain memory arithmetic), ``vllm``, ``vllm@0.19``, ``sglang``, ``trtllm``, ``gpt-fast``,
    a preset name (``vllm-0.17``) or an engine YAML; the one reading of ``--engine`` for plan and estimate."""
    from tfcalc.spec.presets import load_engine

    names = [item for value in values or ["vllm"] for item in split_list(value)]
    if not names:
        raise UsageError("name an engine: --engine vllm (or sglang, trtllm, gpt-fast, ideal, NAME@VERSION)")
    return [None if name == "ideal" else load_engine(name) for name in names]


def _merged(*values: list[str] | None) -> list[str] | None:
    merged = [v for value in values for v in value or []]
    return merged or None


ListOpt = list[str] | None


@handle_errors
def plan(preset: PresetOpt = None, config: ConfigOpt = None,
         gpu: GpuOpt = ["h100-sxm"],  # noqa: B006 - Typer reads the default, never mutates it
         engine: EngineOpt = None,
         num_gpus: Annotated[ListOpt, typer.Option(
             "--num-gpus", "-n", help="GPU count(s); lists sweep. Default tp x pp.", show_default=False)] = None,
         tp: Annotated[ListOpt, typer.Option(
             "--tensor-parallel-size", "--tp", "-tp", help="Tensor-parallel degree(s); default: num_gpus / pp. "
             "With --min-gpus: the degrees allowed.", show_default=False)] = None,
         pp: Annotated[ListOpt, typer.Option(
             "--pipeline-parallel-size", "--pp", "-pp", help="Pipeline-parallel degree(s); default 1. With "
             "--min-gpus: the degrees allowed (e.g. 1,2,3 admits pipeline stages inside a node).",
             show_default=False)] = None,
         ep: Annotated[list[str], typer.Option(
             "--ep", help="Expert-parallel degree(s): routed experts split over ep GPUs (1 = tp-sliced).")]
         = ["1"],  # noqa: B006
         context: Annotated[ListOpt, typer.Option(
             "--max-model-len", "--context", help="Context length(s) in tokens (vLLM max_model_len): 8192, 128k, "
             "lists 4k,32k; default: the model's max context.", show_default=False)] = None,
         batch: BatchOpt = ["1"],  # noqa: B006
         weights_dtype: WeightsOpt = None,
         kv_dtype: KvDtypeOpt = None,
         kv_cache_dtype: Annotated[ListOpt, typer.Option(
             "--kv-cache-dtype", help="Same as --kv-dtype (vLLM's name): bf16, fp8...", show_default=False)] = None,
         gpu_memory_utilization: Annotated[ListOpt, typer.Option(
             "--gpu-memory-utilization", "--mem-fraction-static", "--free-gpu-memory-fraction",
             help="The engine's memory fraction (vLLM gpu_memory_utilization, SGLang mem_fraction_static, "
             "TensorRT-LLM free_gpu_memory_fraction); default: the engine's.", show_default=False)] = None,
         block_size: Annotated[ListOpt, typer.Option(
             "--block-size", help="KV block size(s) in tokens; default: the engine's (vLLM 16).",
             show_default=False)] = None,
         max_num_seqs: Annotated[ListOpt, typer.Option(
             "--max-num-seqs", help="Sequences the engine schedules at once (sizes its dummy sampler run); "
             "default: the engine's for this GPU (vLLM 1024 on >= 70 GiB GPUs).", show_default=False)] = None,
         max_num_batched_tokens: Annotated[ListOpt, typer.Option(
             "--max-num-batched-tokens", "--prefill-chunk", help="Tokens per forward pass (sizes the profiling "
             "forward); default: the engine's for this GPU (vLLM 8192 on >= 70 GiB GPUs).",
             show_default=False)] = None,
         runtime_overhead: Annotated[ListOpt, typer.Option(
             "--runtime-overhead", help="--engine ideal (or gpt-fast) only: CUDA context, NCCL, cuBLAS, CUDA graphs "
             "per GPU (bytes; 1g = 2^30; default 1g).", show_default=False)] = None,
         cuda_graph_memory: Annotated[bool | None, typer.Option(
             "--cuda-graph-memory/--no-cuda-graph-memory", help="Subtract the CUDA-graph estimate from the KV "
             "budget (vLLM VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS); default: as the engine version does.",
             show_default=False)] = None,
         find_min_gpus: Annotated[bool, typer.Option(
             "--min-gpus", help="Search the smallest GPU count that fits: tp within a node, pp only across whole "
             "nodes (vLLM's advice), unless --tp/--pp name the degrees allowed.")] = False,
         max_gpus: Annotated[int, typer.Option(help="Upper bound for --min-gpus.")] = 512,
         gpus_per_node: Annotated[int, typer.Option(help="Largest tp for --min-gpus.")] = 8,
         explain: ExplainOpt = False, plot: PlotOpt = None, fmt: FormatOpt = None, output: OutputOpt = None) -> None:
    """Weights, every reserved term and the KV budget per GPU as the serving engine counts them; KV tokens; max
    sequences at a context; max context at a batch; verdict."""
    from tfcalc.report.plan import PlanSweep, plan_rows

    if max_gpus < 1 or gpus_per_node < 1:
        raise UsageError(f"--max-gpus ({max_gpus}) and --gpus-per-node ({gpus_per_node}) must be at least 1")
    specs = resolve_models(preset, config)
    gpus = gpu_list(gpu)
    engines = engine_list(engine)
    precisions = weight_precisions(weights_dtype)
    kv_dtypes = parse_dtype_list(_merged(kv_dtype, kv_cache_dtype))
    sweep = PlanSweep(
        num_gpus=parse_sizes(num_gpus, "GPU count"), tps=parse_sizes(tp, "tp"), pps=parse_sizes(pp, "pp"),
        eps=parse_sizes(ep, "ep"), contexts=parse_sizes(context, "context"), batches=parse_sizes(batch, "batch"),
        precisions=precisions, kv_dtypes=kv_dtypes, engines=engines,
        utilizations=float_list(gpu_memory_utilization, "gpu memory utilization", 1.0),
        block_sizes=parse_sizes(block_size, "block size"), max_num_seqs=parse_sizes(max_num_seqs, "max_num_seqs"),
        max_num_batched_tokens=parse_sizes(max_num_batched_tokens, "max_num_batched_tokens"),
        runtime_overheads=parse_sizes(runtime_overhead, "runtime overhead"), cuda_graphs_in_budget=cuda_graph_memory,
        find_min_gpus=find_min_gpus, max_gpus=max_gpus, gpus_per_node=gpus_per_node)
    rows, traces = plan_rows(specs, gpus, sweep)
    notes = (*dict.fromkeys(engine_note(e) for e in engines),
             "KV tokens: what the engine logs; max seqs add up over data-parallel replicas. GiB = 2^30 bytes.",
             *(f"{r['model']} on {r['num_gpus']} x {r['gpu']} ({r['engine']}), batch {r['batch']}, context "
               f"{r['context']:,}: {r['reason']}" + (f" [{r['note']}]" if r["note"] else "") for r in rows))
    emit(rows, COLUMNS, fmt, output, title="Plan", notes=notes)
    if explain:
        emit_explanation(traces_text(rows, traces, ("model", "gpu", "engine", "num_gpus", "tp", "pp", "context",
                                                     "batch")), fmt, output)
    if plot is not None:
        from tfcalc.output.plot import plot_plan
        from tfcalc.report.plan import memory_by_context

        plot_plan(plot, *memory_by_context(specs, gpus, rows[0], precisions, kv_dtypes, engines))
        print_stderr(f"wrote plot to {plot}")
    if rows and all(r["max_concurrent_sequences"] == 0 for r in rows):
        # What one sequence lacks (not the row's batch): its KV bytes minus the budget (negative when weights overflow).
        def one(r: dict) -> int:
            return int(r["kv_bytes_per_sequence_per_gpu"]) - int(r["kv_budget_bytes_per_gpu"])

        closest = min(rows, key=one)
        raise fail(f"{closest['model']} does not fit on {closest['num_gpus']} x {closest['gpu']} even at batch 1 at "
                   f"context {closest['context']:,} ({closest['engine']}): short by {one(closest) / (1 << 30):,.2f} "
                   "GiB per GPU", 1)
