"""``tfcalc plan``: does a model fit on these GPUs, for how many sequences at what context?"""

import sys
from pathlib import Path
from typing import Annotated

import typer

from tfcalc.cli.common import (
    BatchOpt,
    ConfigOpt,
    ContextOpt,
    FormatOpt,
    KvDtypeOpt,
    OutputOpt,
    PresetOpt,
    fail,
    handle_errors,
    parse_dtype_list,
    resolve_models,
)
from tfcalc.errors import UsageError
from tfcalc.output import Column, emit
from tfcalc.units import parse_float, parse_sizes, split_list

GpuOpt = Annotated[list[str], typer.Option(
    "--gpu", "-g", help="GPU preset (see 'tfcalc presets list --kind gpu') or a GPU YAML file; lists compare.")]
WeightsOpt = Annotated[list[str] | None, typer.Option(
    "--weights-dtype", "-w", help="Weight format(s): bf16, fp8, int4-g128, nvfp4, lists, or per component "
    "(experts=mxfp4,default=bf16); default: the checkpoint's.", show_default=False)]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Also draw a PNG chart here (needs matplotlib).",
                                              show_default=False)]
ExplainOpt = Annotated[bool, typer.Option("--explain", help="Print the formula trace behind each row.")]

COLUMNS = [
    Column("model", "model"), Column("gpu", "GPU"), Column("num_gpus", "GPUs", "int"), Column("tp", "tp", "int"),
    Column("pp", "pp", "int"), Column("weights_dtype", "weights"), Column("kv_dtype", "KV"),
    Column("context", "context", "int"), Column("batch", "batch", "int"),
    Column("weights_bytes_per_gpu", "weights/GPU", "bytes"), Column("kv_bytes_per_token_per_gpu", "KV/token/GPU",
                                                                     "bytes"),
    Column("reserved_bytes_per_gpu", "reserved/GPU", "bytes"), Column("kv_budget_bytes_per_gpu", "KV budget/GPU",
                                                                      "bytes"),
    Column("max_concurrent_sequences", "max seqs", "int"), Column("max_context_at_batch", "max ctx @batch", "int"),
    Column("fits", "fits", "bool"),
]


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


def print_traces(rows: list[dict], traces: list[tuple[str, ...]], keys: tuple[str, ...]) -> None:
    for row, trace in zip(rows, traces, strict=True):
        sys.stdout.write("\n# " + ", ".join(f"{k}={row[k]}" for k in keys) + "\n")
        sys.stdout.write("".join(f"  {line}\n" for line in trace))


@handle_errors
def plan(preset: PresetOpt = None, config: ConfigOpt = None,
         gpu: GpuOpt = ["h100-sxm"],  # noqa: B006 - Typer reads the default, never mutates it
         num_gpus: Annotated[list[str] | None, typer.Option(
             "--num-gpus", "-n", help="GPU count(s); lists sweep. Default 1.", show_default=False)] = None,
         tp: Annotated[list[str] | None, typer.Option(
             "--tp", help="Tensor-parallel degree(s); default: num_gpus / pp. With --min-gpus: the degrees "
             "allowed.", show_default=False)] = None,
         pp: Annotated[list[str] | None, typer.Option(
             "--pp", help="Pipeline-parallel degree(s); default 1. With --min-gpus: the degrees allowed "
             "(e.g. 1,2,3 admits pipeline stages inside a node).", show_default=False)] = None,
         ep: Annotated[list[str], typer.Option(
             "--ep", help="Expert-parallel degree(s): routed experts split over ep GPUs (1 = tp-sliced).")]
         = ["1"],  # noqa: B006
         context: ContextOpt = None, batch: BatchOpt = ["1"],  # noqa: B006
         weights_dtype: WeightsOpt = None, kv_dtype: KvDtypeOpt = None,
         gpu_memory_utilization: Annotated[list[str], typer.Option(
             "--gpu-memory-utilization", help="Fraction of GPU memory the engine may use (vLLM default 0.9).")]
         = ["0.9"],  # noqa: B006
         block_size: Annotated[list[str], typer.Option(
             "--block-size", help="KV block size(s) in tokens (PagedAttention).")] = ["16"],  # noqa: B006
         runtime_overhead: Annotated[list[str], typer.Option(
             "--runtime-overhead", help="CUDA context, NCCL, cuBLAS workspace, CUDA graphs per GPU (bytes; "
             "1g = 2^30); lists sweep.")] = ["1g"],  # noqa: B006
         prefill_chunk: Annotated[list[str], typer.Option(
             "--prefill-chunk", help="Tokens per forward pass (vLLM max_num_batched_tokens) for the activation "
             "workspace; lists sweep.")] = ["8k"],  # noqa: B006
         find_min_gpus: Annotated[bool, typer.Option(
             "--min-gpus", help="Search the smallest GPU count that fits: tp within a node, pp only across whole "
             "nodes (vLLM's advice), unless --tp/--pp name the degrees allowed.")] = False,
         max_gpus: Annotated[int, typer.Option(help="Upper bound for --min-gpus.")] = 512,
         gpus_per_node: Annotated[int, typer.Option(help="Largest tp for --min-gpus.")] = 8,
         explain: ExplainOpt = False, plot: PlotOpt = None, fmt: FormatOpt = None, output: OutputOpt = None) -> None:
    """Weights, reserved memory and KV budget per GPU; max sequences at a context; max context at a batch; verdict."""
    from tfcalc.report.plan import plan_rows

    specs = resolve_models(preset, config)
    gpus = gpu_list(gpu)
    precisions = weight_precisions(weights_dtype)
    kv_dtypes = parse_dtype_list(kv_dtype)
    contexts = parse_sizes(context, "context")
    batches = parse_sizes(batch, "batch")
    rows, traces = plan_rows(
        specs, gpus, parse_sizes(num_gpus, "GPU count"), parse_sizes(tp, "tp"), parse_sizes(pp, "pp"),
        parse_sizes(ep, "ep"), contexts, batches, precisions, kv_dtypes,
        float_list(gpu_memory_utilization, "gpu memory utilization", 1.0), parse_sizes(block_size, "block size"),
        parse_sizes(runtime_overhead, "runtime overhead"), parse_sizes(prefill_chunk, "prefill chunk"),
        find_min_gpus, max_gpus, gpus_per_node)
    notes = ("reserved = capacity x (1 - utilization) + runtime overhead + activation workspace; KV budget = capacity "
             "- weights - reserved; KV in blocks of block_size tokens, window caps applied; max seqs add up over "
             "data-parallel replicas. Capacity: vendor GB = GiB on HBM parts. GiB = 2^30 bytes.",
             *(f"{r['model']} on {r['num_gpus']} x {r['gpu']}, batch {r['batch']}, context {r['context']:,}: "
               f"{r['reason']}" for r in rows))
    emit(rows, COLUMNS, fmt, output, title="Plan", notes=notes)
    if explain:
        print_traces(rows, traces, ("model", "gpu", "num_gpus", "tp", "pp", "context", "batch"))
    if plot is not None:
        from tfcalc.output.plot import plot_plan

        plot_plan(plot, specs, gpus, rows, precisions, kv_dtypes)
        sys.stderr.write(f"wrote plot to {plot}\n")
    if rows and all(r["max_concurrent_sequences"] == 0 for r in rows):
        # What one sequence lacks (not the row's batch): its KV bytes minus the budget (negative when weights overflow).
        def one(r: dict) -> int:
            return int(r["kv_bytes_per_sequence_per_gpu"]) - int(r["kv_budget_bytes_per_gpu"])

        closest = min(rows, key=one)
        raise fail(f"{closest['model']} does not fit on {closest['num_gpus']} x {closest['gpu']} even at batch 1 at "
                   f"context {closest['context']:,}: short by {one(closest) / (1 << 30):,.2f} GiB per GPU", 1)
