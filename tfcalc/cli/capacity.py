"""``tfcalc capacity``: traffic + latency targets -> the cheapest configuration, its Pareto frontier, launch flags."""

from __future__ import annotations

import math
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from tfcalc.cli.common import (
    MIN_EFFICIENCY,
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
    choice,
    engines_asked,
    fail,
    file_path,
    float_list,
    handle_errors,
    kv_cache_memory_bytes,
    rate_overrides,
    resolve_models,
    weight_precisions,
)
from tfcalc.errors import TfcalcError, UsageError
from tfcalc.output import Column, Verbatim, pick, print_stderr, varies, wide
from tfcalc.units import MAX_TOKENS, parse_float, parse_size, parse_sizes, split_list

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|us|µs)?", re.IGNORECASE)


def parse_duration(text: str, what: str) -> float:
    """``500ms``, ``0.5s``, ``2`` (seconds), ``800us`` -> seconds (> 0)."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise UsageError(f"invalid {what} '{text}': expected a duration such as 500ms or 1.5s")
    value = float(match.group(1)) * {"ms": 1e-3, "s": 1.0, "us": 1e-6, "µs": 1e-6, None: 1.0}[
        (match.group(2) or "").lower() or None]
    if not 0 <= value <= MAX_SECONDS:
        raise UsageError(f"invalid {what} '{text}': must be between 0 and {MAX_SECONDS:,.0f} s")
    return value


MAX_SECONDS = 1e6


def parse_targets(values: list[str] | None, metric: str) -> list:
    """``p90=500ms,p99=1s`` / ``mean=40ms`` items for one metric -> Targets; a percentile given twice is an error."""
    from tfcalc.calc.serving_traffic import Target

    targets = []
    for value in values or []:
        for item in split_list(value, f"--{metric}"):
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
            if any(t.percentile == percentile for t in targets):
                raise UsageError(f"--{metric} {which} is given twice")
            targets.append(Target(metric=metric, percentile=percentile, seconds=seconds))  # type: ignore[arg-type]
    return targets


DEFAULT_ACCEPTANCE = 0.7  # --acceptance: a draft token's acceptance probability when none is given
MAX_SIMULATED_REQUESTS = 2_000_000  # --sim-requests x --max-simulations: the simulation check's worst case
INPUT_LEN, OUTPUT_LEN = "1k", "256"  # --input-len / --output-len defaults (a --lengths-csv run refuses others)


def _check_model_len(spec: Any, model_len: int, request_tokens: float, given: bool) -> None:
    """The context the engines are launched with must hold the mean request and stay within the model's."""
    if given and model_len > spec.max_context:
        raise UsageError(f"--max-model-len {model_len:,} exceeds {spec.name}'s context of {spec.max_context:,} tokens")
    if request_tokens > model_len:
        where = "--max-model-len" if given else f"{spec.name}'s context"
        raise UsageError(f"the mean request ({request_tokens:,.0f} tokens in and out) does not fit {where} of "
                         f"{model_len:,} tokens")


def _length(mean: str, spread: float | None, kind: str, what: str):
    from tfcalc.calc.serving_traffic import LengthDist

    tokens = parse_size(mean, what, MAX_TOKENS)
    if kind in ("fixed", "exponential") and spread:
        raise UsageError(f"--{what.split()[0]}-spread needs --length-dist uniform or lognormal (the {kind} "
                         "distribution has no spread to set)")
    if spread is None:  # a spread given, 0 included, is checked by LengthDist, never replaced by the default
        spread = 0.5 if kind == "lognormal" else 0.0
    return LengthDist(kind=kind, mean=float(tokens), spread=spread)  # type: ignore[arg-type]


def read_lengths_csv(path: Path) -> tuple:
    """(input lengths, output lengths) from a CSV with columns input_tokens and output_tokens (one row per
    request; a byte-order mark and spaces around the names are allowed, as spreadsheets write them); one-line
    errors for anything else."""
    import csv

    from tfcalc.calc.serving_traffic import LengthDist

    if not path.is_file():
        raise UsageError(f"{path}: " + ("is a folder, not a file" if path.is_dir() else "no such file"))
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            fields = [name.strip() for name in reader.fieldnames or []]
            reader.fieldnames = fields
            names = {"input_tokens", "output_tokens"}
            if not names <= set(fields):
                raise UsageError(f"{path}: needs columns input_tokens and output_tokens (found: "
                                 f"{', '.join(fields) or 'none'})")
            twice = sorted(name for name in names if fields.count(name) > 1)
            if twice:  # csv.DictReader would keep the last column of a name, silently
                raise UsageError(f"{path}: column {twice[0]} appears twice in the header")
            inputs, outputs = [], []
            for row in reader:
                line = reader.line_num  # the file's own line (blank lines are skipped, yet counted)
                if row.get(None):  # csv.DictReader's key for the cells past the header's
                    raise UsageError(f"{path}:{line}: {len(fields) + len(row[None])} cells, the header names "
                                     f"{len(fields)}")
                try:
                    i, o = int(row["input_tokens"]), int(row["output_tokens"])
                except (TypeError, ValueError):
                    raise UsageError(f"{path}:{line}: input_tokens and output_tokens must be integers") from None
                if not (1 <= i <= MAX_TOKENS and 1 <= o <= MAX_TOKENS):
                    raise UsageError(f"{path}:{line}: token counts must be 1 to {MAX_TOKENS:,}")
                inputs.append(i)
                outputs.append(o)
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not inputs:
        raise UsageError(f"{path}: no requests")
    return (LengthDist(kind="empirical", values=tuple(inputs)), LengthDist(kind="empirical", values=tuple(outputs)))


def _offers(gpu_names: list[str] | None, price_overrides: list[str] | None, tier: str = "any") -> list:
    """The GPUs searched and their prices: --price first, else presets/prices.yaml's rate, of the --price-tier kind
    (neocloud / hyperscaler) unless 'any'; by default every GPU with such a price."""
    from tfcalc.calc.capacity import GpuOffer
    from tfcalc.spec.presets import load_gpu, preset_names
    from tfcalc.spec.prices import load_prices, parse_price_overrides

    every_price = load_prices()
    prices = {name: p for name, p in every_price.items() if tier in ("any", p.provider_kind)}
    others = {name: p.provider_kind for name, p in every_price.items() if name not in prices}
    overrides: dict[str, float] = {}
    for name, usd in parse_price_overrides(price_overrides).items():  # by the preset's own name: H100-SXM, a file
        try:
            canonical = load_gpu(name).name
        except TfcalcError as exc:
            raise UsageError(f"--price: {exc}") from None
        if canonical in overrides:
            raise UsageError(f"--price for '{canonical}' is given twice ({name})")
        overrides[canonical] = usd
    names = [n for value in gpu_names or [] for n in split_list(value, "--gpu")]
    if not names:
        names = [n for n in preset_names("gpu") if n in prices or n in overrides]
    offers = []
    for name in dict.fromkeys(names):
        gpu = load_gpu(name)
        if gpu.name in overrides:
            offers.append(GpuOffer(gpu=gpu, price_per_hour=overrides[gpu.name], price_source="command line"))
        elif gpu.name in prices:
            p = prices[gpu.name]
            offers.append(GpuOffer(gpu=gpu, price_per_hour=p.usd_per_gpu_hour, price_source=p.source,
                                   price_kind=p.provider_kind, price_as_of=p.as_of))
        elif gpu.name in others:
            raise UsageError(f"GPU '{gpu.name}' has only a {others[gpu.name]} price, not a {tier} one: pass --price "
                             f"{gpu.name}=USD_PER_GPU_HOUR or --price-tier any")
        else:
            raise UsageError(f"no price for GPU '{gpu.name}': pass --price {gpu.name}=USD_PER_GPU_HOUR")
    unknown = sorted(set(overrides) - {o.gpu.name for o in offers})
    if unknown:
        raise UsageError(f"--price given for '{unknown[0]}', which is not among the GPUs searched")
    return offers


# The tables' columns; the latency at each target (operating_ttft_p90_s, ...) goes before "binding".
SUMMARY_COLUMNS = pick(varies("model", "engine"), "gpu", "layout", "formats", "seqs_chunk", "num_gpus",
                       "cost_per_hour", "binding_constraint",
                       wide("replicas", "cost_per_million_input_tokens", "cost_per_million_output_tokens",
                            "capacity_requests_per_s_per_replica"))
FRONTIER_COLUMNS = pick(varies("model", "engine"), "gpu", "layout", "formats", "seqs_chunk",
                        "frontier_output_tokens_per_s_per_user", "frontier_output_tokens_per_s_per_gpu",
                        wide("num_gpus", "cost_per_hour"))
POINTS = ("frontier", "all")


def summary_columns(targets: list) -> list[Column]:
    """SUMMARY_COLUMNS with each target's latency at the operating point before the binding constraint."""
    at = [c.key for c in SUMMARY_COLUMNS].index("binding_constraint")
    return [*SUMMARY_COLUMNS[:at], *pick(*(f"operating_{t.key}" for t in targets)), *SUMMARY_COLUMNS[at:]]


def _progress(total: int):
    """Progress on stderr once the search has run for a second (``tfcalc.output.progress.Progress``): a status line
    on a terminal, else (a CI log, a pipe) a plain line every ten seconds. ``update(done)`` during the search,
    ``simulating(n, plan)`` as the simulation check starts its n-th simulation, ``close()`` at the end."""
    from tfcalc.output.progress import Progress

    progress = Progress()

    def update(done: int) -> None:
        progress.say(f"searching: {done:,} / {total:,} configurations")

    def simulating(number: int, plan: Any) -> None:   # an Evaluation
        from tfcalc.report.capacity import layout

        progress.say(f"checking by simulation: {number} ({plan.num_gpus} x {plan.candidate.gpu} {layout(plan)})")

    return update, simulating, progress.close


def _one(values: list[str] | None, what: str) -> str | None:
    items = [item for value in values or [] for item in split_list(value, what)]
    if len(items) > 1:
        raise UsageError(f"give one {what} (capacity searches one value; got {', '.join(items[:4])})")
    return items[0] if items else None


def _overheads(engines: list, api_servers: int | None, request: str | None, api_request: str | None,
               api_token: str | None, step: str | None, stream: str | None) -> dict:
    """Each engine's overhead defaults with the command line's replacements."""
    from tfcalc.calc.capacity import engine_label
    from tfcalc.calc.serving_traffic import engine_overheads

    changes: dict[str, object] = {}
    for value, name, flag in ((request, "request_s", "--request-overhead"),
                              (api_request, "api_request_s", "--api-request-overhead"),
                              (api_token, "api_token_s", "--api-token-overhead"),
                              (step, "step_s", "--step-overhead"), (stream, "stream_s", "--stream-overhead")):
        if value is not None:
            changes[name] = parse_duration(value, flag)
    if api_servers is not None:
        changes["api_servers"] = api_servers
    out = {}
    for e in engines:
        base = engine_overheads(e)
        out[engine_label(e)] = replace(base, **changes, source=base.source + (" (command line changes)" if changes
                                                                                 else ""))
    return out


@handle_errors
def capacity(preset: PresetOpt = None, config: ConfigOpt = None,
             gpu: Annotated[list[str] | None, typer.Option(
                 "--gpu", "-g", help="GPU type(s) to consider (default: every GPU preset with a price).",
                 show_default=False)] = None,
             price: Annotated[list[str] | None, typer.Option(
                 "--price", help="GPU=USD per GPU-hour, overrides presets/prices.yaml (repeatable).",
                 show_default=False)] = None,
             price_tier: Annotated[str, typer.Option(
                 "--price-tier", help="Which presets/prices.yaml rates to use: any, neocloud (GPU clouds) or "
                 "hyperscaler (AWS, Azure, Google, Oracle); a GPU without one needs --price.",
                 parser=choice)] = "any",
             input_len: Annotated[str, typer.Option("--input-len", help="Mean prompt tokens (1k = 1024).")] = INPUT_LEN,
             output_len: Annotated[str, typer.Option("--output-len", help="Mean output tokens.")] = OUTPUT_LEN,
             length_dist: Annotated[str, typer.Option(
                 "--length-dist", help="fixed | uniform (spread = range ratio) | lognormal (spread = coefficient "
                 "of variation) | exponential.", parser=choice)] = "fixed",
             input_spread: Annotated[float | None, typer.Option("--input-spread", show_default=False,
                                                                help="Spread of prompt lengths.")] = None,
             output_spread: Annotated[float | None, typer.Option("--output-spread", show_default=False,
                                                                 help="Spread of output lengths.")] = None,
             lengths_csv: Annotated[Path | None, typer.Option(
                 "--lengths-csv", help="CSV of requests (columns input_tokens, output_tokens) instead of the "
                 "length options.", show_default=False,
                 parser=file_path)] = None,
             rate: Annotated[str | None, typer.Option("--rate", help="Requests per second (Poisson arrivals).",
                                                      show_default=False)] = None,
             concurrency: Annotated[str | None, typer.Option(
                 "--concurrency", help="Or: requests always in flight (closed loop).", show_default=False)] = None,
             ttft: Annotated[list[str] | None, typer.Option(
                 "--ttft", help="Time-to-first-token targets: p50=300ms,p99=2s or mean=...", show_default=False)]
             = None,
             tpot: Annotated[list[str] | None, typer.Option(
                 "--tpot", help="Time-per-output-token targets, per request (after the first token): p90=50ms",
                 show_default=False)] = None,
             itl: Annotated[list[str] | None, typer.Option(
                 "--itl", help="Inter-token latency targets, over every gap between streamed tokens: p99=100ms",
                 show_default=False)] = None,
             e2e: Annotated[list[str] | None, typer.Option(
                 "--e2e", help="End-to-end latency targets: p99=20s", show_default=False)] = None,
             max_gpus: Annotated[int, typer.Option(help="Most GPUs the plan may use.")] = 64,
             gpus_per_node: Annotated[int, typer.Option(help="Largest tensor-parallel degree.")] = 8,
             tp: TensorParallelOpt = None,
             pp: PipelineParallelOpt = None,
             ep: Annotated[str, typer.Option(
                 "--ep", help="Expert parallel for MoE models: auto (try both), on (ep = tp), off.", parser=choice)]
             = "auto",
             redundant_experts: RedundantExpertsOpt = 0,
             attention_dp: Annotated[list[str] | None, typer.Option(
                 "--attention-dp", help="Data-parallel attention ranks to try for MoE models (DeepSeek-style wide "
                 "ep: dp ranks of tp GPUs, each its own scheduler, share the experts at ep = tp x dp; beyond the "
                 "GPU's NVLink domain (8; GB200/GB300 NVL72: 72) the all-to-all crosses InfiniBand NDR), e.g. "
                 "1,2,4,8,32.",
                 show_default="1")] = None,
             weights_dtype: WeightsOpt = None, kv_dtype: KvDtypeOpt = None, kv_cache_dtype: KvCacheDtypeOpt = None,
             max_num_seqs: MaxNumSeqsOpt = None, max_num_batched_tokens: MaxNumBatchedTokensOpt = None,
             max_model_len: MaxModelLenOpt = None, gpu_memory_utilization: GpuMemoryUtilizationOpt = None,
             block_size: BlockSizeOpt = None, engine: EngineOpt = None,
             api_server_count: Annotated[int | None, typer.Option(
                 "--api-server-count", help="API server processes per replica (vLLM --api-server-count; default 1).",
                 show_default=False)] = None,
             request_overhead: Annotated[str | None, typer.Option(
                 "--request-overhead", help="Request latency beyond the API server's work (network, IPC; default "
                 "per engine).", show_default=False)] = None,
             api_request_overhead: Annotated[str | None, typer.Option(
                 "--api-request-overhead", help="API server's serial work per request: HTTP, template, "
                 "tokenization (default per engine).", show_default=False)] = None,
             api_token_overhead: Annotated[str | None, typer.Option(
                 "--api-token-overhead", help="API server's serial work per streamed chunk: detokenize, JSON, SSE "
                 "(default per engine).", show_default=False)] = None,
             step_overhead: Annotated[str | None, typer.Option(
                 "--step-overhead", help="CPU time per engine step not overlapped with the GPU.",
                 show_default=False)] = None,
             stream_overhead: Annotated[str | None, typer.Option(
                 "--stream-overhead", help="Latency from the API server to the client.", show_default=False)]
             = None,
             model_runner: ModelRunnerOpt = None,
             extensible_kv_cache: ExtensibleKvCacheOpt = None,
             kv_cache_memory: KvCacheMemoryOpt = None,
             prefix_hit: Annotated[float, typer.Option(
                 "--prefix-hit", help="Share of each prompt found in the prefix cache (0-1).")] = 0.0,
             speculative: Annotated[int, typer.Option(
                 "--speculative", help="Also try speculative decoding with this many draft tokens (0: off).")] = 0,
             acceptance: Annotated[float | None, typer.Option(
                 "--acceptance", help=f"Probability each draft token is accepted (default {DEFAULT_ACCEPTANCE}).",
                 show_default=False)] = None,
             draft_cost: Annotated[float | None, typer.Option(
                 "--draft-cost", help="Draft forward time / target decode step (default: one layer, 1/layers).",
                 show_default=False)] = None,
             disaggregated: Annotated[bool, typer.Option(
                 "--disaggregated", help="Also size disaggregated prefill/decode pools (rate traffic only).")]
             = False,
             enable_mixed_chunk: Annotated[bool, typer.Option(
                 "--enable-mixed-chunk", help="SGLang: prefill chunks share the decode batch's step (its "
                 "--enable-mixed-chunk) instead of running in steps of their own first (its default).")] = False,
             kv_transfer_gbps: Annotated[float | None, typer.Option(
                 "--kv-transfer-gbps", help="GB/s for KV from prefill to decode pool (default 50: 400 Gb/s IB).",
                 show_default=False)] = None,
             routing: Annotated[str, typer.Option(
                 "--routing", help="How MoE tokens pick experts: uniform, zipf:S or power-law:ALPHA "
                 "(aiconfigurator's workload), as in estimate.")] = "uniform",
             compute_efficiency: Annotated[list[str] | None, typer.Option(
                 "--compute-efficiency", help="Replace the GPU's GEMM/attention fraction of peak.",
                 show_default=False)] = None,
             bandwidth_efficiency: Annotated[list[str] | None, typer.Option(
                 "--bandwidth-efficiency", help="Replace the GPU's fraction of HBM bandwidth.", show_default=False)]
             = None,
             calibration: Annotated[Path | None, typer.Option(
                 "--calibration", help="'tfcalc bench calibrate' output or a calibration of efficiencies (as for "
                 "estimate).", show_default=False,
                 parser=file_path)] = None,
             simulate: Annotated[bool, typer.Option(
                 "--simulate/--no-simulate", help="Check the chosen plan with the discrete-event simulation.")]
             = True,
             sim_requests: Annotated[int, typer.Option("--sim-requests", help="Requests per simulation.")] = 2000,
             max_simulations: Annotated[int, typer.Option(
                 "--max-simulations", help="Simulations the check may run before it stops with the cheapest plan "
                 "confirmed so far.")] = 12,
             model_path: Annotated[str | None, typer.Option(
                 "--model-path", help="Checkpoint for the launch command lines: a Hugging Face repository id or a "
                 "folder (default: the preset's hf_repo, or the repository id named by -p; a config.json's folder "
                 "when it holds the weights, else its _name_or_path).", show_default=False)] = None,
             top: Annotated[int, typer.Option("--top", help="Configurations listed in the table.")] = 10,
             points: Annotated[str, typer.Option(
                 "--points", help="CSV/JSON rows: frontier (the chosen plan, the cheapest listed and the Pareto "
                 "frontier, one row each) or all (every evaluated point, long format).", parser=choice)] = "frontier",
             workers: Annotated[int | None, typer.Option(
                 "--workers", help="Processes for the search and its simulation check (default: the CPU count, "
                 "at most 4).",
                 show_default=False)] = None,
             explain: ExplainOpt = False, plot: PlotOpt = None, fmt: FormatOpt = None,
             output: OutputOpt = None) -> None:
    """The cheapest GPU configuration that serves a traffic within latency targets: Pareto frontier, cost per
    million tokens, why the runners-up lose, and vLLM / SGLang / TensorRT-LLM launch flags."""
    from tfcalc.calc.capacity import (
        SearchSpace,
        count_candidates,
        full_evaluation,
        nearest_miss,
        search,
        verified_choice,
    )
    from tfcalc.calc.engine import served_precision
    from tfcalc.calc.kernels import parse_routing
    from tfcalc.calc.kv_cache import default_kv_dtype
    from tfcalc.calc.serving import SpecDecoding
    from tfcalc.calc.serving_traffic import Traffic
    from tfcalc.dtypes import get_dtype, parse_weight_precision
    from tfcalc.output import emit, emit_explanation, explanation_lines, resolve_format
    from tfcalc.report import capacity as report
    from tfcalc.spec.engine import with_prefix_caching
    from tfcalc.spec.prices import PROVIDER_KINDS

    if points not in POINTS:
        raise UsageError(f"--points must be frontier or all, got '{points}'")
    if length_dist not in ("fixed", "uniform", "lognormal", "exponential"):
        raise UsageError(f"unknown length distribution '{length_dist}' (fixed, uniform, lognormal, exponential)")
    if price_tier not in ("any", *PROVIDER_KINDS):
        raise UsageError(f"--price-tier must be any, {' or '.join(PROVIDER_KINDS)}, not '{price_tier}'")
    if ep not in ("auto", "on", "off"):
        raise UsageError(f"--ep must be auto, on or off, got '{ep}'")
    ranks = tuple(parse_sizes(attention_dp or ["1"], "--attention-dp", maximum=max(max_gpus, 1)))
    if ep == "off" and max(ranks) > 1:
        raise UsageError("--attention-dp shares the experts over ep = tp x dp: it needs --ep auto or on")
    for flag, value, low, high in (("--top", top, 1, 10_000), ("--max-gpus", max_gpus, 1, 1 << 20),
                                   ("--gpus-per-node", gpus_per_node, 1, 1024),
                                   ("--sim-requests", sim_requests, 10, 1_000_000),
                                   ("--max-simulations", max_simulations, 1, 10_000),
                                   ("--speculative", speculative, 0, 64)):
        if not low <= value <= high:
            raise UsageError(f"{flag} must be {low:,} to {high:,}, got {value}")
    if simulate and sim_requests * max_simulations > MAX_SIMULATED_REQUESTS:
        raise UsageError(f"--sim-requests {sim_requests:,} x --max-simulations {max_simulations:,} could simulate "
                         f"{sim_requests * max_simulations:,} requests, past tfcalc's {MAX_SIMULATED_REQUESTS:,} "
                         "(minutes at a few thousand a second): lower one of them")
    if not speculative and (acceptance is not None or draft_cost is not None):
        raise UsageError("--acceptance and --draft-cost describe speculative decoding: add --speculative N")
    if not disaggregated and kv_transfer_gbps is not None:
        raise UsageError("--kv-transfer-gbps is the disaggregated pools' link: add --disaggregated")
    for flag, number, low, high, closed in (("--acceptance", acceptance, 0.0, 1.0, True),
                                            ("--draft-cost", draft_cost, 0.0, 1.0, True),
                                            ("--kv-transfer-gbps", kv_transfer_gbps, 0.0, 1e7, False)):
        if number is not None and not (low <= number <= high if closed else low < number <= high):
            raise UsageError(f"{flag} must be in {'[' if closed else '('}{low:g}, {high:g}], got {number}")
    if not 0 <= prefix_hit < 1:
        raise UsageError(f"--prefix-hit must be in [0, 1), got {prefix_hit}")
    if api_server_count is not None and not 1 <= api_server_count <= 4096:
        raise UsageError(f"--api-server-count must be 1 to 4096, got {api_server_count}")
    if workers is not None and not 1 <= workers <= 64:
        raise UsageError(f"--workers must be 1 to 64, got {workers}")
    if model_path is not None and not model_path.strip():  # not the preset's checkpoint, silently
        raise UsageError("--model-path is empty: name a Hugging Face repo or a local checkpoint folder")
    specs = resolve_models(preset, config)
    check_redundant_experts(specs, redundant_experts, (1,) if ep == "off" else (2,))
    engines = engines_asked(engine, extensible_kv_cache, model_runner)
    if enable_mixed_chunk:
        from tfcalc.spec.engine import with_mixed_chunk

        if not any(e is not None and e.scheduler.prefill_first for e in engines):
            raise UsageError("--enable-mixed-chunk is SGLang's: add --engine sglang")
        engines = [with_mixed_chunk(e) if e is not None else e for e in engines]
    if lengths_csv is not None:
        given = (("--input-len", input_len, INPUT_LEN), ("--output-len", output_len, OUTPUT_LEN),
                 ("--length-dist", length_dist, "fixed"), ("--input-spread", input_spread, None),
                 ("--output-spread", output_spread, None))
        ignored = [flag for flag, value, default in given if value != default]
        if ignored:
            raise UsageError(f"--lengths-csv gives the request lengths: drop {', '.join(ignored)}")
        inputs, outputs = read_lengths_csv(lengths_csv)
    else:
        inputs = _length(input_len, input_spread, length_dist, "input len")
        outputs = _length(output_len, output_spread, length_dist, "output len")
    if (rate is None) == (concurrency is None):
        raise UsageError("give the traffic as --rate REQ_PER_S or --concurrency N (one of them)")
    traffic = Traffic(input_len=inputs, output_len=outputs,
                      rate_per_s=parse_float(rate, "--rate", 0.0, 1e9) if rate is not None else None,
                      concurrency=parse_size(concurrency, "--concurrency") if concurrency is not None else None,
                      prefix_hit_ratio=prefix_hit)
    targets = tuple(parse_targets(ttft, "ttft") + parse_targets(tpot, "tpot") + parse_targets(itl, "itl")
                    + parse_targets(e2e, "e2e"))
    if not targets:
        raise UsageError("give at least one latency target: --ttft p90=1s, --tpot p90=50ms, --itl p99=100ms or "
                         "--e2e p99=30s")
    overheads = _overheads(engines, api_server_count, request_overhead, api_request_overhead, api_token_overhead,
                           step_overhead, stream_overhead)
    rates = rate_overrides(float_list(compute_efficiency, "compute efficiency", 1.0, MIN_EFFICIENCY),
                           float_list(bandwidth_efficiency, "bandwidth efficiency", 1.0, MIN_EFFICIENCY), calibration)
    if len(rates) != 1:
        raise UsageError("give one --compute-efficiency and one --bandwidth-efficiency")
    utilization = _one(gpu_memory_utilization, "--gpu-memory-utilization")
    kv_memory = kv_cache_memory_bytes(kv_cache_memory, engines)
    block = _one(block_size, "--block-size")
    model_len_text = _one(max_model_len, "--max-model-len")
    offers = _offers(gpu, price, price_tier)
    table = resolve_format(fmt, output) == "table"
    all_rows: list[dict] = []
    failed: list[str] = []
    summary: list[dict] = []
    notes: list[str] = []
    extra: list = []
    explained: list[str] = []
    for spec in specs:
        # a quantized checkpoint is served as it is stored; a 16-bit one also as the engine's online fp8 (each
        # engine's own 16-bit format for a float32 checkpoint)
        per_engine = [[native] if native.quantized else [native, parse_weight_precision("fp8")]
                      for native in (served_precision(spec, e) for e in engines)]
        precisions = weight_precisions(weights_dtype) or list(dict.fromkeys(p for ps in per_engine for p in ps))
        engine_weights = None if weights_dtype or len({tuple(ps) for ps in per_engine}) == 1 else tuple(
            frozenset(p.label for p in ps) for ps in per_engine)
        kv_given = [get_dtype(k) for v in [*(kv_dtype or []), *(kv_cache_dtype or [])] for k in split_list(v)]
        per_engine_kv = [list(dict.fromkeys([default_kv_dtype(spec, e), get_dtype("fp8")])) for e in engines]
        kv_dtypes = kv_given or list(dict.fromkeys(k for ks in per_engine_kv for k in ks))
        engine_kv = None if kv_given or len({tuple(ks) for ks in per_engine_kv}) == 1 else tuple(
            frozenset(k.name for k in ks) for ks in per_engine_kv)
        model_len = parse_size(model_len_text, "max model len") if model_len_text else min(
            spec.max_context, max(2048, math.ceil((inputs.quantile(0.999) + outputs.quantile(0.999)) / 1024) * 1024))
        _check_model_len(spec, model_len, inputs.mean + outputs.mean, bool(model_len_text))
        spec_options: list = [None]
        if speculative:
            cost = draft_cost if draft_cost is not None else 1 / spec.num_layers
            spec_options.append(SpecDecoding(num_tokens=speculative, acceptance=DEFAULT_ACCEPTANCE if acceptance is None
                                             else acceptance, draft_cost=cost))
        space = SearchSpace(
            gpus=tuple(offers), weight_precisions=tuple(precisions), kv_dtypes=tuple(kv_dtypes),
            engine_weights=engine_weights, engine_kv=engine_kv,
            tps=tuple(parse_sizes(tp, "tp")), pps=tuple(parse_sizes(pp or ["1"], "pp")),
            expert_parallel={"auto": (False, True), "on": (True,), "off": (False,)}[ep],
            attention_dp=ranks,
            max_num_seqs=tuple(parse_sizes(max_num_seqs or ["8,16,32,64,128,256,512"], "max_num_seqs")),
            chunk_sizes=tuple(parse_sizes(max_num_batched_tokens or ["512,2048,8192"], "max_num_batched_tokens")),
            engines=tuple(with_prefix_caching(e, prefix_hit > 0) for e in engines), max_gpus=max_gpus,
            gpus_per_node=gpus_per_node, max_model_len=model_len,
            gpu_memory_utilization=parse_float(utilization, "gpu memory utilization", 0.0, 1.0)
            if utilization is not None else None,
            block_size=parse_size(block, "block size") if block is not None else None,
            kv_cache_memory_bytes=kv_memory, speculative=tuple(spec_options), disaggregated=disaggregated,
            routing=parse_routing(routing), rates=rates[0][0],
            **({} if kv_transfer_gbps is None else {"kv_transfer_bytes_per_s": kv_transfer_gbps * 1e9}),
            redundant_experts=redundant_experts)
        update, simulating, close = _progress(count_candidates(spec, space))
        search_workers = workers if workers is not None else min(os.cpu_count() or 1, 4)

        def full(e, spec=spec, space=space):  # noqa: ANN001, ANN202 - an Evaluation with its model objects
            return full_evaluation(spec, traffic, targets, space, overheads, e)

        try:
            result = search(spec, traffic, targets, space, overheads, progress=update, workers=search_workers,
                            operating=not table and points == "all")
            if simulate and result.best is not None:
                checked = verified_choice(result, traffic, targets, space, full, num_requests=sim_requests,
                                          max_simulations=max_simulations, workers=search_workers,
                                          progress=simulating)
                chosen, sim_lines, simulated = checked.plan, list(checked.lines), checked.simulated
            else:
                chosen, sim_lines, simulated = result.best, [], {}
        finally:
            close()
        result = replace(result, best=chosen)
        if chosen is None:
            failed.append(spec.name)
        feasible = [e for e in result.evaluations if e.feasible]
        if chosen is not None:
            feasible = [chosen, *(e for e in feasible if e is not chosen)]
        listed = [full(e) for e in report.distinct(feasible, top)]   # with their operating points
        checkpoint = model_path or spec.hf_repo
        launch_args = (checkpoint or "MODEL_PATH", spec, chosen, space, prefix_hit > 0,
                       next(iter(overheads.values())).api_servers) if chosen is not None else None
        rows = (report.long_rows(spec, result, targets) if points == "all" else
                report.summary_points(spec, replace(result, frontier=tuple(full(e) for e in result.frontier)),
                                      listed, targets))
        if launch_args is not None and points != "all":
            rows[0]["launch_command"] = report.launch_command(*launch_args)
            rows[0].update({f"simulated_{key}": value for key, value in simulated.items()})
        if not table:
            all_rows.extend(rows)
        summary.extend(row for row in rows if row.get("role") != "frontier")
        notes.append(f"{spec.name}: {result.candidates:,} configurations searched, "
                     f"{sum(e.fits for e in result.evaluations):,} fit, "
                     f"{sum(e.feasible for e in result.evaluations):,} meet the targets within {max_gpus} GPUs")
        if chosen is None:
            miss = nearest_miss(result.evaluations)
            why = ("" if miss is None else f"; the closest, {miss.candidate.label}, fails on {miss.reason}" if miss.fits
                   else f"; none fits, the roomiest ({miss.candidate.label}): {miss.reason}")
            notes.append(f"{spec.name}: no configuration meets the targets{why}")
        else:
            rich = full(chosen)  # with its operating point and costs (the search's own evaluation may lack them)
            notes.append(report.chosen_sentence(spec, rich, traffic, targets, simulated))
            trust = report.trust_sentence(space.offer(rich.candidate.gpu).gpu, calibrated=calibration is not None)
            if trust:
                notes.append(trust)
            notes.append(report.price_sentence(space.offer(rich.candidate.gpu), space.gpus))
            notes.extend(sim_lines)
            notes.extend(report.runner_up_sentences(spec, result))
            what, commands = report.launch_lines(*launch_args)  # type: ignore[misc]
            notes.append(what if checkpoint else f"{what}; pass --model-path: {spec.name} names no checkpoint (a "
                         "model file without hf_repo, or a config.json with neither weights beside it nor "
                         "_name_or_path)")
            notes.extend(Verbatim(command) for command in commands)
            if rich.model is not None and rich.model.spec is not None:
                from tfcalc.calc.capacity import speculative_break_even

                at = speculative_break_even(rich.model, replace(rich.model, spec=None))
                notes.append(f"speculative decoding stops paying from a decode batch of {at}" if at else
                             "speculative decoding pays at every batch up to 1,024")
        extra.append((f"Pareto frontier, {spec.name} (at the most traffic within TTFT/E2E)",
                      report.frontier_rows(spec, result, targets), FRONTIER_COLUMNS))
        if explain and chosen is not None:
            explained.append(f"\n# {spec.name}\n" + explanation_lines(
                report.explain_lines(spec, full(chosen), traffic, targets, space)))
        if plot is not None:
            from tfcalc.output.plot import plot_capacity

            lines = [(f"{t.label} {t.seconds * 1e3:g} ms", 1 / t.seconds) for t in targets if t.metric == "tpot"]
            load = f"{traffic.rate_per_s:g} req/s" if traffic.rate_per_s is not None else \
                f"{traffic.concurrency} concurrent"
            title = f"{spec.name}: {traffic.input_len.label} in / {traffic.output_len.label} out, {load}"
            path = plot if len(specs) == 1 else plot.with_name(f"{plot.stem}-{spec.name}{plot.suffix}")
            plot_capacity(path, report.plot_points(result), lines, title)
            print_stderr(f"wrote plot to {path}")
    if table:
        emit(summary, summary_columns(list(targets)), fmt, output,
             title="Capacity: cheapest configurations meeting the targets", notes=tuple(notes), extra=extra)
    else:
        emit(all_rows, summary_columns(list(targets)), fmt, output)
    if explained:
        emit_explanation("".join(explained), fmt, output)
    if failed:
        raise fail(f"no configuration of {', '.join(failed)} meets the targets within {max_gpus} GPUs (see the "
                   "notes for the closest)", 1)
