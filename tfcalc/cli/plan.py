"""``tfcalc plan``: does a model fit on these GPUs, for how many sequences at what context?"""

from typing import TYPE_CHECKING, Annotated

import typer

from tfcalc.cli.common import (
    BatchOpt,
    BlockSizeOpt,
    ConfigOpt,
    EngineOpt,
    ExplainOpt,
    ExtensibleKvCacheOpt,
    FormatOpt,
    GpuMemoryUtilizationOpt,
    KvCacheDtypeOpt,
    KvCacheMemoryOpt,
    KvDtypeOpt,
    ListOpt,
    MaxModelLenOpt,
    MaxNumBatchedTokensOpt,
    MaxNumSeqsOpt,
    ModelRunnerOpt,
    OutputOpt,
    PipelineParallelOpt,
    PlotOpt,
    PresetOpt,
    RedundantExpertsOpt,
    TensorParallelOpt,
    WeightsOpt,
    check_redundant_experts,
    check_runtime_overhead,
    check_sweep_rows,
    complete_preset,
    engines_asked,
    fail,
    float_list,
    handle_errors,
    kv_cache_memory_bytes,
    parse_dtype_list,
    resolve_models,
    run_sweep,
    weight_precisions,
)
from tfcalc.errors import UsageError
from tfcalc.output import emit, emit_explanation, explanation_lines, pick, print_stderr, varies, wide
from tfcalc.units import parse_sizes, split_list

if TYPE_CHECKING:
    from tfcalc.spec.engine import EngineSpec

GpuOpt = Annotated[list[str], typer.Option(
    "--gpu", "-g", help="GPU preset (see 'tfcalc presets list --kind gpu') or a GPU YAML file; lists compare.",
    autocompletion=complete_preset("gpu"))]
COLUMNS = pick("model", "gpu", "engine", "num_gpus", "tp", "pp", varies("ep", "dp"), "context",
               varies("batch", "weights_dtype", "kv_dtype"), "weights_bytes_per_gpu", "kv_budget_bytes_per_gpu",
               "kv_tokens_per_gpu", "max_concurrent_sequences", "fits",
               wide("max_context_at_batch", "capacity_bytes", "reserved_bytes_per_gpu"))
ENGINE_NOTES = {
    "ideal": "ideal: reserved = capacity x (1 - utilization) + runtime overhead + one prefill chunk's activations; "
             "KV budget = capacity - weights - reserved; window caps applied",
    "vllm": "vllm: KV = capacity (as CUDA reports it) x gpu_memory_utilization - weights - torch peak of the "
            "profiling run (forward of max_num_batched_tokens, sampler over max_num_seqs rows of logits) - "
            "non-torch [- CUDA graphs from 0.20]; max seqs = vLLM's 'Maximum concurrency'",
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
    if engine.budget == "measured" and engine.sizing_margin is not None:
        m = engine.sizing_margin
        return (f"{engine.label}: KV = capacity - startup - weights - non-torch - CUDA graphs - sampler state - "
                f"the transient peak of its warm-up steps - a margin of max({m.floor_bytes / (1 << 30):g} GiB, "
                f"{m.fraction:g} x that peak), sized after warm-up; max seqs = vLLM's 'Maximum concurrency'")
    return ENGINE_NOTES.get(engine.name, engine.name)


def gpu_list(values: list[str]) -> list:
    from tfcalc.spec.presets import load_gpu

    names = [item for value in values for item in split_list(value, "--gpu")]
    if not names:
        raise UsageError("name a GPU: --gpu h100-sxm (see 'tfcalc presets list --kind gpu')")
    return [load_gpu(name) for name in names]


def traces_text(rows: list[dict], traces: list[tuple[str, ...]], keys: tuple[str, ...]) -> str:
    """Each row's trace under ``# key=value, ...`` lines naming it (wrapped at 80 columns)."""
    import textwrap

    return "".join("\n" + textwrap.fill(", ".join(f"{k}={row[k]}" for k in keys), 80, initial_indent="# ",
                                        subsequent_indent="# ", break_on_hyphens=False, break_long_words=False)
                   + "\n" + explanation_lines(trace) for row, trace in zip(rows, traces, strict=True))


def _merged(*values: list[str] | None) -> list[str] | None:
    merged = [v for value in values for v in value or []]
    return merged or None


@handle_errors
def plan(preset: PresetOpt = None, config: ConfigOpt = None,
         gpu: GpuOpt = ["h100-sxm"],  # noqa: B006 - Typer reads the default, never mutates it
         engine: EngineOpt = None,
         num_gpus: Annotated[ListOpt, typer.Option(
             "--num-gpus", "-n", help="GPU count(s); lists sweep. Default tp x pp.", show_default=False)] = None,
         tp: TensorParallelOpt = None,
         pp: PipelineParallelOpt = None,
         ep: Annotated[list[str], typer.Option(
             "--ep", help="Expert-parallel degree(s): routed experts split over ep GPUs (1 = tp-sliced).")]
         = ["1"],  # noqa: B006
         redundant_experts: RedundantExpertsOpt = 0,
         context: MaxModelLenOpt = None,
         batch: BatchOpt = ["1"],  # noqa: B006
         weights_dtype: WeightsOpt = None,
         kv_dtype: KvDtypeOpt = None,
         kv_cache_dtype: KvCacheDtypeOpt = None,
         gpu_memory_utilization: GpuMemoryUtilizationOpt = None,
         block_size: BlockSizeOpt = None,
         max_num_seqs: MaxNumSeqsOpt = None,
         max_num_batched_tokens: MaxNumBatchedTokensOpt = None,
         runtime_overhead: Annotated[ListOpt, typer.Option(
             "--runtime-overhead", help="--engine ideal (or gpt-fast) only: CUDA context, NCCL, cuBLAS, CUDA graphs "
             "per GPU (bytes; 1g = 2^30; default 1g).", show_default=False)] = None,
         cuda_graph_memory: Annotated[bool | None, typer.Option(
             "--cuda-graph-memory/--no-cuda-graph-memory", help="Subtract the CUDA-graph estimate from the KV "
             "budget (vLLM VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS); default: as the engine version does (vLLM "
             "0.34+ sizes its cache after capture: always; the V2 runner of 0.22-0.28 has no estimate: never).",
             show_default=False)] = None,
         model_runner: ModelRunnerOpt = None,
         prefix_caching: Annotated[bool | None, typer.Option(
             "--enable-prefix-caching/--no-enable-prefix-caching", help="vLLM's prefix caching: with it, 0.26+ "
             "keeps 2-3 state blocks a hybrid (Mamba / Gated DeltaNet) request, 1 without. Default: as the engine "
             "version does (on; for hybrid models from 0.28).", show_default=False)] = None,
         extensible_kv_cache: ExtensibleKvCacheOpt = None,
         kv_cache_memory: KvCacheMemoryOpt = None,
         find_min_gpus: Annotated[bool, typer.Option(
             "--min-gpus", help="Search the smallest GPU count that fits: tp within a node, pp only across whole "
             "nodes (vLLM's advice), unless --tp/--pp name the degrees allowed; an MoE model also with its experts "
             "spread over the tp GPUs (ep = tp).")] = False,
         max_gpus: Annotated[int, typer.Option(help="Upper bound for --min-gpus.")] = 512,
         gpus_per_node: Annotated[int, typer.Option(help="Largest tp for --min-gpus.")] = 8,
         explain: ExplainOpt = False, plot: PlotOpt = None, fmt: FormatOpt = None, output: OutputOpt = None) -> None:
    """Weights, every reserved term and the KV budget per GPU as the serving engine counts them; KV tokens; max
    sequences at a context; max context at a batch; verdict."""
    from tfcalc.report.plan import PlanSweep, iter_plan_rows, plan_row_count

    if max_gpus < 1 or gpus_per_node < 1:
        raise UsageError(f"--max-gpus ({max_gpus}) and --gpus-per-node ({gpus_per_node}) must be at least 1")
    specs = resolve_models(preset, config)
    check_redundant_experts(specs, redundant_experts, parse_sizes(ep, "ep"), parse_sizes(tp or [], "tp"))
    gpus = gpu_list(gpu)
    from tfcalc.spec.engine import with_prefix_caching

    engines = [with_prefix_caching(e, prefix_caching)
               for e in engines_asked(engine, extensible_kv_cache, model_runner)]
    check_runtime_overhead(bool(runtime_overhead), engines)
    kv_memory = kv_cache_memory_bytes(kv_cache_memory, engines)
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
        kv_cache_memory_bytes=kv_memory,
        find_min_gpus=find_min_gpus, max_gpus=max_gpus, gpus_per_node=gpus_per_node,
        redundant_experts=redundant_experts)
    total = check_sweep_rows(plan_row_count(specs, gpus, sweep))
    swept = run_sweep(iter_plan_rows(specs, gpus, sweep), total, "plan")
    rows, traces = [row for row, _ in swept.items], [trace for _, trace in swept.items]
    notes = (*dict.fromkeys(engine_note(e) for e in engines),
             "KV tokens: what the engine logs; max seqs add up over data-parallel replicas. GiB = 2^30 bytes.",
             *(f"{r['model']} on {r['num_gpus']} x {r['gpu']} ({r['engine']}), batch {r['batch']}, context "
               f"{r['context']:,}: {r['reason']}" + (f" [{r['note']}]" if r["note"] else "") for r in rows))
    # a layout with its experts spread (ep > 1) always names its ep, even where every row shares it
    spread = any(int(str(r["ep"])) > 1 for r in rows)
    columns = [c._replace(show="always") if c.key == "ep" and spread else c for c in COLUMNS]
    emit(rows, columns, fmt, output, title="Plan", notes=notes)
    if explain:
        emit_explanation(traces_text(rows, traces, ("model", "gpu", "engine", "num_gpus", "tp", "pp", "context",
                                                     "batch")), fmt, output)
    if plot is not None:
        from tfcalc.output.plot import plot_plan
        from tfcalc.report.plan import memory_by_context

        plot_plan(plot, *memory_by_context(specs, gpus, rows[0], precisions, kv_dtypes, engines))
        print_stderr(f"wrote plot to {plot}")
    swept.finish()
    if rows and all(r["max_concurrent_sequences"] == 0 for r in rows):
        # What one sequence lacks (not the row's batch): its KV bytes minus the budget (negative when weights overflow).
        def one(r: dict) -> int:
            return int(r["kv_bytes_per_sequence_per_gpu"]) - int(r["kv_budget_bytes_per_gpu"])

        closest = min(rows, key=one)
        raise fail(f"{closest['model']} does not fit on {closest['num_gpus']} x {closest['gpu']} even at batch 1 at "
                   f"context {closest['context']:,} ({closest['engine']}): short by {one(closest) / (1 << 30):,.2f} "
                   "GiB per GPU", 1)
