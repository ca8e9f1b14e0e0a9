"""``tfcalc estimate``: TTFT, TPOT and throughput from a per-kernel latency model, beside the pure roofline."""

from pathlib import Path
from typing import Annotated

import typer

from tfcalc.cli.common import (
    MIN_EFFICIENCY,
    BatchOpt,
    ConfigOpt,
    EngineOpt,
    ExplainOpt,
    ExtensibleKvCacheOpt,
    FormatOpt,
    KvDtypeOpt,
    ModelRunnerOpt,
    OutputOpt,
    PlotOpt,
    PresetOpt,
    RedundantExpertsOpt,
    WeightsOpt,
    check_redundant_experts,
    check_runtime_overhead,
    check_sweep_size,
    choice,
    engines_asked,
    file_path,
    float_list,
    handle_errors,
    parse_dtype_list,
    rate_overrides,
    resolve_models,
    run_sweep,
    weight_precisions,
)
from tfcalc.cli.plan import GpuOpt, gpu_list
from tfcalc.output import emit, emit_explanation, explanation_lines, pick, print_stderr, varies, wide
from tfcalc.units import MAX_TOKENS, parse_float, parse_size, parse_sizes

COLUMNS = pick("model", "gpu", varies("engine"), "tp", varies("pp", "ep"), "batch", "prompt_len", "gen_len",
               varies("weights_dtype", "kv_dtype"), "ttft_s", "tpot_s", "decode_tokens_per_s",
               "decode_tokens_per_s_per_seq", "decode_limited_by", "fits",
               wide("tpot_s_ideal", "ttft_s_ideal", "e2e_s", "prefill_limited_by"))
OneValue = Annotated[str | None, typer.Option(show_default=False)]


def _turning_note(row: dict, keys: tuple[str, ...] = ()) -> str:
    """The decode batch from which the step is compute-bound; it does not depend on the row's own batch, but on
    the parallelism and the formats (``keys``: the swept ones, named)."""
    from tfcalc.report.estimate import row_choices

    split = "".join(f", {k} {row[k]}" for k in ("pp", "ep") if row.get(k, 1) != 1)
    where = (f"{row['model']} on {row['gpu']} (tp {row['tp']}{split}{row_choices(row, keys)}, "
             f"prompt {row['prompt_len']:,}, gen {row['gen_len']:,})")
    if row["decode_turning_point_batch"]:
        return f"{where}: decode turns compute-bound from batch {row['decode_turning_point_batch']:,}"
    return (f"{where}: decode never turns compute-bound: each sequence's KV reads keep its FLOP/byte below the "
            "GPU's ridge point")


@handle_errors
def estimate(preset: PresetOpt = None, config: ConfigOpt = None,
             gpu: GpuOpt = ["h100-sxm"],  # noqa: B006 - Typer reads the default, never mutates it
             tp: Annotated[list[str], typer.Option("--tp", help="Tensor-parallel degree(s).")] = ["1"],  # noqa: B006
             pp: Annotated[list[str], typer.Option(
                 "--pp", help="Pipeline-parallel degree(s): contiguous layer stages, microbatched.")]
             = ["1"],  # noqa: B006
             ep: Annotated[list[str], typer.Option(
                 "--ep", help="Expert-parallel degree(s); ep > tp runs ep/tp data-parallel attention replicas that "
                 "share the experts (all-to-all dispatch).")] = ["1"],  # noqa: B006
             batch: BatchOpt = ["1"],  # noqa: B006
             prompt_len: Annotated[list[str], typer.Option("--prompt-len", help="Prompt tokens (1k = 1024).")]
             = ["1k"],  # noqa: B006
             gen_len: Annotated[list[str], typer.Option("--gen-len", help="Generated tokens.")]
             = ["256"],  # noqa: B006
             weights_dtype: WeightsOpt = None, kv_dtype: KvDtypeOpt = None,
             kv_cache_dtype: Annotated[list[str] | None, typer.Option(
                 "--kv-cache-dtype", help="Same as --kv-dtype (vLLM's name).", show_default=False)] = None,
             engine: EngineOpt = None,
             interconnect: Annotated[str | None, typer.Option(
                 "--interconnect", help="Fabric within a node (nvlink4, pcie5, ... or a YAML file); default: the "
                 "GPU preset's.", show_default=False)] = None,
             inter_node: Annotated[str, typer.Option(
                 "--inter-node", help="Fabric between nodes, for groups larger than the NVLink domain "
                 "(--gpus-per-node, or the GPU preset's: 72 on a GB200/GB300 NVL72).")]
             = "infiniband-ndr",
             gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.", min=1)] = 8,
             allreduce: Annotated[str | None, typer.Option(
                 "--allreduce", help="NCCL all-reduce algorithm: ring, tree or auto (the faster); default: the "
                 "fabric's.", show_default=False, parser=choice)] = None,
             compute_dtype: Annotated[str, typer.Option(
                 "--compute-dtype", help="Tensor-core format of quantised weights: auto (fp8 W8A8, fp4 where the chip "
                 "has it, int8/int4 weight-only), int8 (W8A8), fp8, fp4, bf16 (weight-only everything).",
                 parser=choice)] = "auto",
             cuda_graphs: Annotated[bool | None, typer.Option(
                 "--cuda-graphs/--no-cuda-graphs", help="Replay steps from CUDA graphs (default: the engine's); "
                 "without, each kernel waits for its host launch.", show_default=False)] = None,
             routing: Annotated[str | None, typer.Option(
                 "--routing", help="How MoE tokens pick experts: uniform (default), zipf:S (popularity ~ rank^-S) or "
                 "power-law:ALPHA (aiconfigurator's workload; it predicts with 1.2, DeepSeek 1.01).",
                 show_default=False)] = None,
             fp8_scales: Annotated[str, typer.Option(
                 "--fp8-scales", help="How per-tensor fp8 linears scale their inputs: auto (the checkpoint's; "
                 "the engine's online quantisation for a 16-bit one: dynamic in vLLM/SGLang), static, dynamic "
                 "(a max reduction per call).", parser=choice)] = "auto",
             redundant_experts: RedundantExpertsOpt = 0,
             routing_skew: Annotated[str | None, typer.Option(
                 "--routing-skew", help="Shorthand for --routing zipf:S (0 = uniform).", show_default=False)] = None,
             compute_efficiency: Annotated[list[str] | None, typer.Option(
                 "--compute-efficiency", help="Replace the GPU's GEMM/attention fraction of peak (lists sweep).",
                 show_default=False)] = None,
             bandwidth_efficiency: Annotated[list[str] | None, typer.Option(
                 "--bandwidth-efficiency", help="Replace the GPU's fraction of HBM bandwidth (lists sweep).",
                 show_default=False)] = None,
             calibration: Annotated[Path | None, typer.Option(
                 "--calibration", help="'tfcalc bench calibrate' output, a calibration of efficiencies or 'tfcalc "
                 "profile' JSON rows (docs/estimate.md).", show_default=False,
                 parser=file_path)] = None,
             ideal: Annotated[bool, typer.Option(
                 "--ideal", help="Report the pure roofline (100 % of the peaks, no floors or latencies) as TTFT/TPOT."
             )] = False,
             fit: Annotated[bool, typer.Option(
                 "--fit/--no-fit", help="Check that the batch fits in memory as 'tfcalc plan' does for the same "
                 "--engine and memory flags, and say so per row.")] = True,
             gpu_memory_utilization: Annotated[str | None, typer.Option(
                 "--gpu-memory-utilization", "--mem-fraction-static", "--free-gpu-memory-fraction",
                 help="For the fit check: the engine's memory fraction (as in tfcalc plan); default: the engine's.",
                 show_default=False)] = None,
             block_size: Annotated[str | None, typer.Option(
                 "--block-size", help="For the fit check: KV block size in tokens; default: the engine's.",
                 show_default=False)] = None,
             max_num_seqs: Annotated[str | None, typer.Option(
                 "--max-num-seqs", help="For the fit check: sequences the engine schedules at once (sizes its "
                 "profiling run); default: the engine's for this GPU.", show_default=False)] = None,
             max_num_batched_tokens: Annotated[str | None, typer.Option(
                 "--max-num-batched-tokens", help="For the fit check: tokens per forward pass; default: the "
                 "engine's for this GPU.", show_default=False)] = None,
             runtime_overhead: Annotated[str | None, typer.Option(
                 "--runtime-overhead", help="For the fit check with --engine ideal (or gpt-fast): CUDA context, "
                 "NCCL, cuBLAS, CUDA graphs per GPU (bytes; default 1g).", show_default=False)] = None,
             cuda_graph_memory: Annotated[bool | None, typer.Option(
                 "--cuda-graph-memory/--no-cuda-graph-memory", help="For the fit check: subtract the CUDA-graph "
                 "estimate from the KV budget; default: as the engine version does.", show_default=False)] = None,
             model_runner: ModelRunnerOpt = None,
             extensible_kv_cache: ExtensibleKvCacheOpt = None,
             explain: ExplainOpt = False, plot: PlotOpt = None, fmt: FormatOpt = None,
             output: OutputOpt = None) -> None:
    """TTFT, TPOT and tokens/s per GPU from every kernel's time (GEMMs, attention, MoE, norms, communication, floors),
    beside the pure roofline, for any tp x pp x ep; --explain shows where the time goes."""
    from tfcalc.calc.kernels import UNIFORM, Routing, parse_routing
    from tfcalc.calc.plan import PlanConfig
    from tfcalc.errors import UsageError
    from tfcalc.report.estimate import (
        EstimateOptions,
        EstimateSweep,
        dequant_sentence,
        explain_lines,
        fit_sentence,
        iter_estimate_rows,
        varying_keys,
    )
    from tfcalc.spec.interconnect import load_interconnect

    specs = resolve_models(preset, config)
    check_redundant_experts(specs, redundant_experts, parse_sizes(ep, "ep"), parse_sizes(tp or [], "tp"))
    gpus = gpu_list(gpu)
    engines = engines_asked(engine, extensible_kv_cache, model_runner)
    check_runtime_overhead(runtime_overhead is not None, engines)
    if allreduce is not None and allreduce not in ("ring", "tree", "auto"):
        raise UsageError(f"invalid --allreduce '{allreduce}': choose ring, tree or auto")
    expert_routing = parse_routing(routing or "uniform")
    if routing_skew is not None:
        if routing is not None:  # --routing uniform too: one of the two would be dropped silently
            raise UsageError("give either --routing or --routing-skew, not both")
        skew = parse_float(routing_skew, "routing skew", 0.0, 4.0)
        expert_routing = Routing("zipf", skew) if skew > 0 else UNIFORM
    fit_flags = {"--gpu-memory-utilization": gpu_memory_utilization, "--block-size": block_size,
                 "--max-num-seqs": max_num_seqs, "--max-num-batched-tokens": max_num_batched_tokens,
                 "--runtime-overhead": runtime_overhead, "--cuda-graph-memory": cuda_graph_memory}
    if not fit and any(value is not None for value in fit_flags.values()):
        raise UsageError(f"{next(f for f, v in fit_flags.items() if v is not None)} sizes the fit check: drop "
                         "--no-fit or the flag")
    if ideal and (compute_efficiency or bandwidth_efficiency or calibration is not None):
        raise UsageError("--ideal reports 100 % of the peaks: drop --compute-efficiency, --bandwidth-efficiency and "
                         "--calibration (or --ideal)")
    overrides = rate_overrides(float_list(compute_efficiency, "compute efficiency", 1.0, MIN_EFFICIENCY),
                               float_list(bandwidth_efficiency, "bandwidth efficiency", 1.0, MIN_EFFICIENCY),
                               calibration)
    memory = PlanConfig(
        num_gpus=1, cuda_graphs_in_budget=cuda_graph_memory, redundant_experts=redundant_experts,
        gpu_memory_utilization=None if gpu_memory_utilization is None else parse_float(
            gpu_memory_utilization, "gpu memory utilization", 0.0, 1.0),
        block_size=None if block_size is None else parse_size(block_size, "block size"),
        max_num_seqs=None if max_num_seqs is None else parse_size(max_num_seqs, "max_num_seqs"),
        max_num_batched_tokens=None if max_num_batched_tokens is None else parse_size(
            max_num_batched_tokens, "max_num_batched_tokens"),
        **({} if runtime_overhead is None else {"runtime_overhead_bytes": parse_size(runtime_overhead,
                                                                                    "runtime overhead")}))
    kv_dtypes = parse_dtype_list([*(kv_dtype or []), *(kv_cache_dtype or [])])
    common = dict(interconnect=load_interconnect(interconnect) if interconnect else None,
                  inter_node=load_interconnect(inter_node), gpus_per_node=gpus_per_node, algorithm=allreduce,
                  compute=compute_dtype, cuda_graphs=cuda_graphs, routing=expert_routing, ideal=ideal, fit=fit,
                  memory=memory, fp8_scales=fp8_scales)
    sweep = EstimateSweep(tps=parse_sizes(tp, "tp"), pps=parse_sizes(pp, "pp"), eps=parse_sizes(ep, "ep"),
                          batches=parse_sizes(batch, "batch"),
                          prompt_lens=parse_sizes(prompt_len, "prompt length", MAX_TOKENS),
                          gen_lens=parse_sizes(gen_len, "generation length", MAX_TOKENS),
                          precisions=weight_precisions(weights_dtype), kv_dtypes=kv_dtypes)
    total = check_sweep_size(specs, gpus, engines, overrides, sweep.tps, sweep.pps, sweep.eps, sweep.batches,
                             sweep.prompt_lens, sweep.gen_lens, sweep.precisions, sweep.kv_dtypes)
    swept = run_sweep((pair for engine_spec in engines for rates, source in overrides
                       for pair in iter_estimate_rows(specs, gpus, sweep, EstimateOptions(
                           **common, engine=engine_spec, rates=rates, rates_source=source))), total, "estimate")
    rows, handles = [row for row, _ in swept.items], [handle for _, handle in swept.items]
    engine_names = ", ".join(dict.fromkeys(str(r["engine"]) for r in rows))
    by_name = {g.name: g for g in gpus}
    varying = varying_keys(rows)
    model = ("pure roofline (100 % of dense peak and HBM bandwidth, no floors or latencies)" if ideal else
             f"per-kernel latency model, engine {engine_names}, rates: "
             + ", ".join(dict.fromkeys(str(r["efficiency_source"]) for r in rows)))
    notes = (f"TTFT/TPOT: {model}; TPOT ideal (--wide) = the pure roofline. TPOT at the mean decode context; decode: "
             "tokens/s of the whole batch, per user: of one sequence (1 / TPOT); 'limited by': what most of the decode "
             "step's time goes to."
             + (f" fits: memory as 'tfcalc plan' counts it for the same engine ({engine_names}) at max_model_len = "
                "prompt + gen." if fit else ""),
             *dict.fromkeys(fit_sentence(r, varying) for r in rows if r.get("fits") is False),
             *dict.fromkeys(_turning_note(r, varying) for r in rows),
             *dict.fromkeys(n for r in rows if (n := dequant_sentence(r, by_name[str(r['gpu'])]))),
             *dict.fromkeys(f"note: {spec.name}: prompt + gen {length:,} exceeds its max context of "
                            f"{spec.max_context:,} tokens" for spec in specs
                            for length in sorted({p + g for p in sweep.prompt_lens for g in sweep.gen_lens})
                            if length > spec.max_context))
    # a pp or ep other than 1 is shown even when every row has it (else a single --ep 2 row reads as plain tp)
    split = {k for k in ("pp", "ep") if any(row.get(k, 1) != 1 for row in rows)}
    columns = [c._replace(show="always") if c.key in split else c for c in COLUMNS]
    emit(rows, columns, fmt, output, title="Estimate", notes=notes)
    if explain:
        parts = []
        for row, handle in zip(rows, handles, strict=True):
            parts.append(f"\n# {row['model']} on {row['gpu']}, engine {row['engine']}\n# tp {row['tp']}, "
                         f"pp {row['pp']}, ep {row['ep']}, batch {row['batch']}, prompt {row['prompt_len']}, "
                         f"gen {row['gen_len']}\n")
            parts.append(explanation_lines(explain_lines(*handle)))
        emit_explanation("".join(parts), fmt, output)
    if plot is not None:
        from tfcalc.output.plot import plot_roofline

        plot_roofline(plot, rows)
        print_stderr(f"wrote plot to {plot}")
    swept.finish()
