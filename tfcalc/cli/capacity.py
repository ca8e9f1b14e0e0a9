"""``tfcalc capacity``: traffic + latency targets -> the cheapest configuration, its Pareto frontier, launch flags."""

from __future__ import annotations

import math
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from tfcalc.cli.common import (
    ConfigOpt,
    FormatOpt,
    KvDtypeOpt,
    OutputOpt,
    PresetOpt,
    fail,
    handle_errors,
    resolve_models,
)
from tfcalc.cli.plan import ExplainOpt, PlotOpt, WeightsOpt
from tfcalc.errors import UsageError
from tfcalc.output import Column
from tfcalc.units import parse_size, parse_sizes, split_list

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|us|µs)?", re.IGNORECASE)


def parse_duration(text: str, what: str) -> float:
    """``500ms``, ``0.5s``, ``2`` (seconds), ``800us`` -> seconds (> 0)."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise UsageError(f"invalid {what} '{text}': expected a duration such as 500ms or 1.5s")
    value = float(match.group(1)) * {"ms": 1e-3, "s": 1.0, "us": 1e-6, "µs": 1e-6, None: 1.0}[
        (match.group(2) or "").lower() or None]
    if value < 0:
        raise UsageError(f"invalid {what} '{text}': must not be negative")
    return value


def parse_targets(values: list[str] | None, metric: str) -> list:
    """``p90=500ms,p99=1s`` / ``mean=40ms`` items for one metric -> Targets."""
    from tfcalc.calc.serving_traffic import Target

    targets = []
    for value in values or []:
        for item in split_list(value):
            which, sep, limit = (part.strip() for part in item.partition("="))
            if not sep:
                raise UsageError(f"invalid --{metric} '{item}': expected PERCENTILE=DURATION, e.g. p90=500ms or "
                                 "mean=40ms")
            if which.lower() in ("mean", "avg"):
                percentile = 0.0
            elif re.fullmatch(r"p\d+(\.\d+)?", which.lower()):
                percentile = float(which[1:])
                if not 0 < percentile < 100:
                    raise UsageError(f"invalid --{metric} '{item}': percentile must be between p0 and p100")
            else:
                raise UsageError(f"invalid --{metric} '{item}': '{which}' is not p50, p90, p99.9 or mean")
            seconds = parse_duration(limit, f"--{metric} target")
            if seconds <= 0:
                raise UsageError(f"invalid --{metric} '{item}': the target must be positive")
            targets.append(Target(metric=metric, percentile=percentile, seconds=seconds))  # type: ignore[arg-type]
    return targets


def _length(mean: str, spread: float | None, kind: str, what: str):
    from tfcalc.calc.serving_traffic import LengthDist

    tokens = parse_size(mean, what)
    if kind == "fixed" and spread:
        raise UsageError(f"--{what.replace(' ', '-')}-spread needs --length-dist uniform or lognormal")
    return LengthDist(kind=kind, mean=float(tokens), spread=spread or (0.5 if kind in ("lognormal",) else 0.0))  # type: ignore[arg-type]


def read_lengths_csv(path: Path) -> tuple:
    """(input lengths, output lengths) from a CSV with columns input_tokens and output_tokens (one row per
    request); one-line errors for anything else."""
    import csv

    from tfcalc.calc.serving_traffic import LengthDist

    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            fields = reader.fieldnames or []
            names = {"input_tokens", "output_tokens"}
            if not names <= set(fields):
                raise UsageError(f"{path}: needs columns input_tokens and output_tokens (found: "
                                 f"{', '.join(fields) or 'none'})")
            inputs, outputs = [], []
            for line, row in enumerate(reader, start=2):
                try:
                    i, o = int(row["input_tokens"]), int(row["output_tokens"])
                except (TypeError, ValueError):
                    raise UsageError(f"{path}:{line}: input_tokens and output_tokens must be integers") from None
                if i < 1 or o < 1:
                    raise UsageError(f"{path}:{line}: token counts must be at least 1")
                inputs.append(i)
                outputs.append(o)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read: {exc}") from None
    if not inputs:
        raise UsageError(f"{path}: no requests")
    return (LengthDist(kind="empirical", values=tuple(inputs)), LengthDist(kind="empirical", values=tuple(outputs)))


def _offers(gpu_names: list[str] | None, price_overrides: list[str] | None) -> list:
    from tfcalc.calc.capacity import GpuOffer
    from tfcalc.spec.presets import load_gpu, preset_names
    from tfcalc.spec.prices import load_prices, parse_price_overrides

    prices = load_prices()
    overrides = parse_price_overrides(price_overrides)
    names = [n for value in gpu_names or [] for n in split_list(value)]
    if not names:
        names = [n for n in preset_names("gpu") if n in prices or n in overrides]
    offers = []
    for name in dict.fromkeys(names):
        gpu = load_gpu(name)
        if gpu.name in overrides:
            offers.append(GpuOffer(gpu=gpu, price_per_hour=overrides[gpu.name], price_source="command line"))
        elif gpu.name in prices:
            p = prices[gpu.name]
            offers.append(GpuOffer(gpu=gpu, price_per_hour=p.usd_per_gpu_hour, price_source=f"{p.source}, {p.as_of}"))
        else:
            raise UsageError(f"no price for GPU '{gpu.name}': pass --price {gpu.name}=USD_PER_GPU_HOUR")
    unknown = sorted(set(overrides) - {o.gpu.name for o in offers})
    if unknown and gpu_names:
        raise UsageError(f"--price given for '{unknown[0]}', which is not among the GPUs searched")
    return offers


SUMMARY_COLUMNS = [
    Column("gpu", "GPU"), Column("layout", "layout"), Column("formats", "w/KV"),
    Column("seqs_chunk", "seqs/chunk"), Column("num_gpus", "GPUs", "int"),
    Column("cost_per_hour", "$/h"),
]
FRONTIER_COLUMNS = [
    Column("gpu", "GPU"), Column("layout", "layout"), Column("formats", "w/KV"), Column("seqs_chunk", "seqs/chunk"),
    Column("tokens_per_user", "tok/s/user", "rate"), Column("tokens_per_gpu", "tok/s/GPU", "rate"),
]


def _summary_columns(targets: list) -> list[Column]:
    from tfcalc.calc.serving_traffic import METRIC_NAMES

    cols = list(SUMMARY_COLUMNS)
    for t in targets:
        which = "mean" if t.percentile == 0 else f"p{t.percentile:g}"
        name = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}.get(t.metric, METRIC_NAMES[t.metric])
        cols.append(Column(t.key, f"{name} {which}", "seconds"))
    cols.append(Column("limit", "limit"))
    return cols


def _progress(total: int):
    """A Rich progress bar on stderr that appears only once the search has run for a second."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    state: dict[str, object] = {"start": time.perf_counter(), "bar": None}
    console = Console(stderr=True)

    def update(done: int) -> None:
        bar = state["bar"]
        if bar is None:
            if time.perf_counter() - float(state["start"]) < 1.0 or not console.is_terminal:  # type: ignore[arg-type]
                return
            bar = Progress(TextColumn("searching"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           console=console, transient=True)
            bar.start()
            state["bar"], state["task"] = bar, bar.add_task("search", total=total)
        bar.update(state["task"], completed=done)  # type: ignore[union-attr]

    def close() -> None:
        if state["bar"] is not None:
            state["bar"].stop()  # type: ignore[union-attr]

    return update, close


@handle_errors
def capacity(preset: PresetOpt = None, config: ConfigOpt = None,
             gpu: Annotated[list[str] | None, typer.Option(
                 "--gpu", "-g", help="GPU type(s) to consider (default: every GPU preset with a price).",
                 show_default=False)] = None,
             price: Annotated[list[str] | None, typer.Option(
                 "--price", help="GPU=USD per GPU-hour, overrides presets/prices.yaml (repeatable).",
                 show_default=False)] = None,
             input_len: Annotated[str, typer.Option("--input-len", help="Mean prompt tokens (1k = 1024).")] = "1k",
             output_len: Annotated[str, typer.Option("--output-len", help="Mean output tokens.")] = "256",
             length_dist: Annotated[str, typer.Option(
                 "--length-dist", help="fixed | uniform (spread = range ratio) | lognormal (spread = coefficient "
                 "of variation) | exponential.")] = "fixed",
             input_spread: Annotated[float | None, typer.Option("--input-spread", show_default=False,
                                                                help="Spread of prompt lengths.")] = None,
             output_spread: Annotated[float | None, typer.Option("--output-spread", show_default=False,
                                                                 help="Spread of output lengths.")] = None,
             lengths_csv: Annotated[Path | None, typer.Option(
                 "--lengths-csv", help="CSV of requests (columns input_tokens, output_tokens) instead of the "
                 "length options.", show_default=False)] = None,
             rate: Annotated[float | None, typer.Option("--rate", help="Requests per second (Poisson arrivals).",
                                                        show_default=False)] = None,
             concurrency: Annotated[int | None, typer.Option(
                 "--concurrency", help="Or: requests always in flight (closed loop).", show_default=False)] = None,
             ttft: Annotated[list[str] | None, typer.Option(
                 "--ttft", help="Time-to-first-token targets: p50=300ms,p99=2s or mean=...", show_default=False)]
             = None,
             tpot: Annotated[list[str] | None, typer.Option(
                 "--tpot", help="Time-per-output-token targets (after the first): p90=50ms", show_default=False)]
             = None,
             e2e: Annotated[list[str] | None, typer.Option(
                 "--e2e", help="End-to-end latency targets: p99=20s", show_default=False)] = None,
             max_gpus: Annotated[int, typer.Option(help="Most GPUs the plan may use.")] = 64,
             gpus_per_node: Annotated[int, typer.Option(help="Largest tensor-parallel degree.")] = 8,
             tp: Annotated[list[str] | None, typer.Option(
                 "--tp", help="Tensor-parallel degrees allowed (default 1,2,4,8 up to --gpus-per-node).",
                 show_default=False)] = None,
             pp: Annotated[list[str], typer.Option("--pp", help="Pipeline-parallel degrees allowed.")]
             = ["1"],  # noqa: B006 - Typer reads the default, never mutates it
             ep: Annotated[str, typer.Option(
                 "--ep", help="Expert parallel for MoE models: auto (try both), on (ep = tp), off.")] = "auto",
             weights_dtype: WeightsOpt = None, kv_dtype: KvDtypeOpt = None,
             max_num_seqs: Annotated[list[str], typer.Option(
                 "--max-num-seqs", help="max_num_seqs values to try.")] = ["8,16,32,64,128,256,512"],  # noqa: B006
             chunk: Annotated[list[str], typer.Option(
                 "--max-num-batched-tokens", "--chunk", help="Token budget per step (chunked prefill) to try.")]
             = ["512,2048,8192"],  # noqa: B006
             max_model_len: Annotated[str | None, typer.Option(
                 "--max-model-len", help="Engine max-model-len (default: p99.9 prompt + output, rounded up to 1k, "
                 "at most the model's).", show_default=False)] = None,
             gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization")] = 0.9,
             engine: Annotated[str, typer.Option(
                 "--engine", help="vllm | sglang: per-request overhead defaults and the command line shown first.")]
             = "vllm",
             request_overhead: Annotated[str | None, typer.Option(
                 "--request-overhead", help="HTTP + tokenization + hand-off per request (default per engine).",
                 show_default=False)] = None,
             step_overhead: Annotated[str | None, typer.Option(
                 "--step-overhead", help="CPU time per engine step not overlapped with the GPU.",
                 show_default=False)] = None,
             stream_overhead: Annotated[str | None, typer.Option(
                 "--stream-overhead", help="Detokenize + stream one token to the client.", show_default=False)]
             = None,
             prefix_hit: Annotated[float, typer.Option(
                 "--prefix-hit", help="Share of each prompt found in the prefix cache (0-1).")] = 0.0,
             speculative: Annotated[int, typer.Option(
                 "--speculative", help="Also try speculative decoding with this many draft tokens (0: off).")] = 0,
             acceptance: Annotated[float, typer.Option(
                 "--acceptance", help="Probability each draft token is accepted.")] = 0.7,
             draft_cost: Annotated[float | None, typer.Option(
                 "--draft-cost", help="Draft forward time / target decode step (default: one layer, 1/layers).",
                 show_default=False)] = None,
             disaggregated: Annotated[bool, typer.Option(
                 "--disaggregated", help="Also size disaggregated prefill/decode pools (rate traffic only).")]
             = False,
             kv_transfer_gbps: Annotated[float, typer.Option(
                 "--kv-transfer-gbps", help="GB/s for KV from prefill to decode pool (400 Gb/s IB = 50).")] = 50.0,
             compute_efficiency: Annotated[list[str] | None, typer.Option(
                 "--compute-efficiency", help="Fraction of dense peak FLOP/s reached (default 0.6).",
                 show_default=False)] = None,
             bandwidth_efficiency: Annotated[list[str] | None, typer.Option(
                 "--bandwidth-efficiency", help="Fraction of HBM / link bandwidth reached (default 0.6).",
                 show_default=False)] = None,
             calibration: Annotated[Path | None, typer.Option(
                 "--calibration", help="JSON of measured efficiencies (as for estimate).", show_default=False)]
             = None,
             simulate: Annotated[bool, typer.Option(
                 "--simulate/--no-simulate", help="Check the chosen plan with the discrete-event simulation.")]
             = True,
             sim_requests: Annotated[int, typer.Option("--sim-requests", help="Requests per simulation.")] = 2000,
             model_path: Annotated[str | None, typer.Option(
                 "--model-path", help="Model name for the launch command lines (default: the preset name).",
                 show_default=False)] = None,
             top: Annotated[int, typer.Option("--top", help="Configurations listed in the table.")] = 10,
             workers: Annotated[int | None, typer.Option(
                 "--workers", help="Processes for the search (default: the CPU count, at most 4).",
                 show_default=False)] = None,
             explain: ExplainOpt = False, plot: PlotOpt = None, fmt: FormatOpt = None,
             output: OutputOpt = None) -> None:
    """The cheapest GPU configuration that serves a traffic within latency targets: Pareto frontier, cost per
    million tokens, why the runners-up lose, and vLLM / SGLang launch flags."""
    from tfcalc.calc.capacity import SearchSpace, count_candidates, full_evaluation, search
    from tfcalc.calc.kv_cache import default_kv_dtype
    from tfcalc.calc.serving import SpecDecoding
    from tfcalc.calc.serving_traffic import ENGINE_OVERHEADS, Traffic
    from tfcalc.cli.estimate import _efficiencies
    from tfcalc.cli.plan import float_list, weight_precisions
    from tfcalc.dtypes import get_dtype, parse_weight_precision
    from tfcalc.output import emit
    from tfcalc.report import capacity as report

    specs = resolve_models(preset, config)
    if engine not in ENGINE_OVERHEADS:
        raise UsageError(f"unknown engine '{engine}' (vllm, sglang)")
    if length_dist not in ("fixed", "uniform", "lognormal", "exponential"):
        raise UsageError(f"unknown length distribution '{length_dist}' (fixed, uniform, lognormal, exponential)")
    if ep not in ("auto", "on", "off"):
        raise UsageError(f"--ep must be auto, on or off, got '{ep}'")
    if top < 1 or sim_requests < 10 or max_gpus < 1 or gpus_per_node < 1:
        raise UsageError("--top, --max-gpus and --gpus-per-node must be positive and --sim-requests at least 10")
    if not 0 < gpu_memory_utilization <= 1:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}")
    if speculative < 0 or not 0 <= acceptance <= 1 or kv_transfer_gbps <= 0:
        raise UsageError("--speculative must be >= 0, --acceptance in [0, 1], --kv-transfer-gbps positive")
    if lengths_csv is not None:
        inputs, outputs = read_lengths_csv(lengths_csv)
    else:
        inputs = _length(input_len, input_spread, length_dist, "input len")
        outputs = _length(output_len, output_spread, length_dist, "output len")
    if (rate is None) == (concurrency is None):
        raise UsageError("give the traffic as --rate REQ_PER_S or --concurrency N (one of them)")
    traffic = Traffic(input_len=inputs, output_len=outputs, rate_per_s=rate, concurrency=concurrency,
                      prefix_hit_ratio=prefix_hit)
    targets = tuple(parse_targets(ttft, "ttft") + parse_targets(tpot, "tpot") + parse_targets(e2e, "e2e"))
    if not targets:
        raise UsageError("give at least one latency target: --ttft p90=1s, --tpot p90=50ms or --e2e p99=30s")
    base = ENGINE_OVERHEADS[engine]
    overheads = replace(
        base, request_s=parse_duration(request_overhead, "--request-overhead") if request_overhead else base.request_s,
        step_s=parse_duration(step_overhead, "--step-overhead") if step_overhead else base.step_s,
        stream_s=parse_duration(stream_overhead, "--stream-overhead") if stream_overhead else base.stream_s)
    effs = _efficiencies(float_list(compute_efficiency, "compute efficiency", 1.0),
                         float_list(bandwidth_efficiency, "bandwidth efficiency", 1.0), calibration)
    if len(effs) != 1:
        raise UsageError("give one --compute-efficiency and one --bandwidth-efficiency")
    offers = _offers(gpu, price)
    from tfcalc.output import resolve_format

    table = resolve_format(fmt, output) == "table"
    all_rows: list[dict] = []
    failed: list[str] = []
    summary: list[dict] = []
    notes: list[str] = []
    extra: list = []
    for spec in specs:
        precisions = weight_precisions(weights_dtype) or list(dict.fromkeys(
            [parse_weight_precision(spec.native_dtype), parse_weight_precision("fp8")]))
        kv_dtypes = [get_dtype(k) for v in kv_dtype or [] for k in split_list(v)] or list(dict.fromkeys(
            [default_kv_dtype(spec), get_dtype("fp8")]))
        model_len = parse_size(max_model_len, "max model len") if max_model_len else min(
            spec.max_context, max(2048, math.ceil((inputs.quantile(0.999) + outputs.quantile(0.999)) / 1024) * 1024))
        spec_options: list = [None]
        if speculative:
            cost = draft_cost if draft_cost is not None else 1 / spec.num_layers
            spec_options.append(SpecDecoding(num_tokens=speculative, acceptance=acceptance, draft_cost=cost))
        space = SearchSpace(
            gpus=tuple(offers), weight_precisions=tuple(precisions), kv_dtypes=tuple(kv_dtypes),
            tps=tuple(parse_sizes(tp, "tp")), pps=tuple(parse_sizes(pp, "pp")),
            expert_parallel={"auto": (False, True), "on": (True,), "off": (False,)}[ep],
            max_num_seqs=tuple(parse_sizes(max_num_seqs, "max num seqs")),
            chunk_sizes=tuple(parse_sizes(chunk, "max num batched tokens")), max_gpus=max_gpus,
            gpus_per_node=gpus_per_node, max_model_len=model_len, gpu_memory_utilization=gpu_memory_utilization,
            speculative=tuple(spec_options), disaggregated=disaggregated,
            kv_transfer_bytes_per_s=kv_transfer_gbps * 1e9)
        update, close = _progress(count_candidates(spec, space))
        try:
            result = search(spec, traffic, targets, space, overheads, effs[0], progress=update,
                            workers=workers if workers is not None else min(os.cpu_count() or 1, 4))
        finally:
            close()
        def full(e, spec=spec, space=space):
            return full_evaluation(spec, traffic, targets, space, overheads, effs[0], e)

        chosen, sim_lines = _verified(result, traffic, targets, simulate, sim_requests, full)
        result = replace(result, best=chosen)
        if chosen is None:
            failed.append(spec.name)
        if not table:
            all_rows.extend(report.long_rows(spec, result, targets))
        feasible = [e for e in result.evaluations if e.feasible]
        if chosen is not None:
            feasible = [chosen, *(e for e in feasible if e is not chosen)]
        listed = report.distinct(feasible, top)
        summary.extend(report.summary_row(spec, e, targets, i + 1) for i, e in enumerate(listed))
        notes.append(f"{spec.name}: {result.candidates:,} configurations searched, "
                     f"{sum(e.fits for e in result.evaluations):,} fit, "
                     f"{sum(e.feasible for e in result.evaluations):,} meet the targets within {max_gpus} GPUs")
        if chosen is None:
            closest = min((e for e in result.evaluations if e.fits), default=None,
                          key=lambda e: (e.replicas == 0, -e.capacity_rate_per_s))
            notes.append(f"{spec.name}: no configuration meets the targets"
                         + (f"; the closest, {closest.candidate.label}, fails on {closest.reason}" if closest else ""))
        else:
            notes.append(report.chosen_sentence(spec, chosen, traffic, targets))
            notes.extend(sim_lines)
            notes.extend(report.runner_up_sentences(spec, result))
            notes.extend(report.launch_lines(model_path or spec.name, spec, chosen, space, prefix_hit > 0))
            rich = full(chosen)
            if rich.model is not None and rich.model.spec is not None:
                from tfcalc.calc.capacity import speculative_break_even

                without = replace(rich.model, spec=None)
                at = speculative_break_even(rich.model, without)
                notes.append(f"speculative decoding stops paying from a decode batch of {at}" if at else
                             "speculative decoding pays at every batch up to 1,024")
        extra.append((f"Pareto frontier, {spec.name} (at the most traffic within TTFT/E2E)",
                      report.frontier_rows(spec, result), FRONTIER_COLUMNS))
        if explain and chosen is not None:
            notes.append(f"explain {spec.name}:")
            notes.extend(f"  {line}" for line in report.explain_lines(spec, full(chosen), traffic, targets, space))
        if plot is not None:
            from tfcalc.output.plot import plot_capacity

            lines = [(f"{t.label} {t.seconds * 1e3:g} ms", 1 / t.seconds) for t in targets if t.metric == "tpot"]
            title = (f"{spec.name}: {traffic.input_len.label} in / {traffic.output_len.label} out, "
                     + (f"{rate:g} req/s" if rate is not None else f"{concurrency} concurrent"))
            path = plot if len(specs) == 1 else plot.with_name(f"{plot.stem}-{spec.name}{plot.suffix}")
            plot_capacity(path, report.plot_points(result), lines, title)
            sys.stderr.write(f"wrote plot to {path}\n")
    if table:
        if len(specs) > 1:
            columns = [Column("model", "model"), *_summary_columns(list(targets))]
        else:
            columns = _summary_columns(list(targets))
        emit(summary, columns, fmt, output, title="Capacity: cheapest configurations meeting the targets",
             notes=tuple(notes), extra=extra)
    else:
        emit(all_rows, [], fmt, output)
    if failed:
        raise fail(f"no configuration of {', '.join(failed)} meets the targets within {max_gpus} GPUs (see the "
                   "notes for the closest)", 1)


def _verified(result, traffic, targets, simulate: bool, requests: int, full) -> tuple:
    """The chosen plan, checked by simulation: the cheapest feasible configuration whose simulated replica also
    meets the targets (up to five tried), with a line per check."""
    from tfcalc.calc.capacity import simulate_evaluation

    best = result.best
    if best is None or not simulate:
        return best, []
    lines = []
    tried = 0
    for e in result.evaluations:
        if not e.feasible or tried >= 5:
            break
        sim = simulate_evaluation(full(e), traffic, num_requests=requests)
        if sim is None:
            return e, ["simulation: not run for disaggregated plans"]
        tried += 1
        measured = ", ".join(f"{t.label} {sim.metric(t.metric, t.percentile) * 1e3:,.1f} ms" for t in targets)
        ok = all(sim.metric(t.metric, t.percentile) <= t.seconds for t in targets)
        lines.append(f"simulation of one replica ({requests:,} requests, {sim.steps:,} steps, {sim.preemptions} "
                     f"preemptions) of {e.candidate.label}: {measured} -> "
                     f"{'meets the targets' if ok else 'misses a target'}")
        if ok:
            return e, lines
    lines.append("simulation: none of the five cheapest plans met every target in simulation; the model's choice "
                 "is shown")
    return best, lines
