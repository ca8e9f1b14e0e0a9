"""Capacity-search results for people: table rows, long-format rows, the explanation of the chosen plan, why
the runners-up lose, and the engine command lines. No I/O."""

from __future__ import annotations

import json
import math
import shlex

from tfcalc.calc.capacity import (
    Candidate,
    Evaluation,
    GpuOffer,
    SearchResult,
    SearchSpace,
    nearest_miss,
    searched_engine,
)
from tfcalc.calc.engine import takes_kv_cache_memory, unserved_format
from tfcalc.calc.serving_traffic import Target, Traffic
from tfcalc.spec.engine import EngineSpec
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec
from tfcalc.units import format_count

Row = dict[str, object]


def short_dtype(label: str, native: str) -> str:
    """``fp8_e4m3`` -> fp8, ``int4-g128`` -> int4, the checkpoint's own mixed format -> native."""
    if label == native and "=" in label:
        return "native"
    if "=" in label:
        return label.rsplit("default=", 1)[-1] + "+"
    return {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8e5", "fp8_block": "fp8b", "int4-g128": "int4"}.get(label, label)


def layout(e: Evaluation) -> str:
    c = e.candidate
    parts = ([f"tp{c.tp}"] + ([f"pp{c.pp}"] if c.pp > 1 else []) + ([f"dp{c.dp}"] if c.dp > 1 else [])
             + ([f"ep{c.ep}" + (f"+{c.redundant_experts}r" if c.redundant_experts else "")] if c.ep > 1 else []))
    text = "·".join(parts)
    if c.mode == "disaggregated":
        text = f"P {c.prefill_layout.replace(' ', '·')}+D {text}"
    if c.spec is not None:
        text += f" +spec{c.spec.num_tokens}"
    return text


def _number(e: Evaluation, key: str) -> float | None:
    value = e.numbers.get(key)
    return value if value is not None and math.isfinite(value) else None


def long_rows(spec: ModelSpec, result: SearchResult, targets: tuple[Target, ...]) -> list[Row]:
    """Every evaluated configuration as (configuration..., metric, value, unit) rows: long (tidy) format."""
    rows: list[Row] = []
    best = result.best
    for e in result.evaluations:
        c = e.candidate
        base: Row = {"model": spec.name, "engine": c.engine, "gpu": c.gpu, "mode": c.mode, "tp": c.tp, "pp": c.pp,
                     "ep": c.ep, "dp": c.dp, **({"redundant_experts": c.redundant_experts} if c.redundant_experts
                                                else {}),
                     "weights_dtype": c.weights, "kv_dtype": c.kv_dtype, "max_num_seqs": c.max_num_seqs,
                     "max_num_batched_tokens": c.chunk, "speculative_tokens": c.spec.num_tokens if c.spec else 0}
        if c.mode == "disaggregated":
            base.update(prefill_tp=c.prefill_tp, prefill_ep=c.prefill_ep, prefill_replicas=c.prefill_replicas)
        values: list[tuple[str, object, str]] = [
            ("chosen", best is not None and e.candidate == best.candidate, "bool"), ("fits", e.fits, "bool"),
            ("feasible", e.feasible, "bool"),
            ("reason", e.reason, "text"), ("price_per_gpu_hour", e.price_per_gpu_hour, "USD/h"),
        ]
        if e.memory is not None:
            values += [("weights_bytes_per_gpu", e.memory.weights_bytes_per_gpu, "bytes"),
                       ("kv_budget_bytes_per_gpu", e.memory.kv_budget_bytes_per_gpu, "bytes"),
                       ("kv_capacity_tokens_per_replica", e.memory.kv_capacity_tokens, "tokens")]
        if e.fits:
            values += [("capacity_requests_per_s_per_replica", e.capacity_rate_per_s, "req/s"),
                       ("capacity_concurrency_per_replica", e.capacity_concurrency, "requests"),
                       ("binding_constraint", e.binding, "text"), ("replicas", e.replicas, "count"),
                       ("num_gpus", e.num_gpus, "count"), ("cost_per_hour", e.cost_per_hour, "USD/h"),
                       ("cost_per_million_input_tokens", e.cost_per_m_input, "USD"),
                       ("cost_per_million_output_tokens", e.cost_per_m_output, "USD")]
            if "tokens_per_user" in e.numbers:
                values += [("frontier_output_tokens_per_s_per_gpu", _number(e, "tokens_per_gpu"), "tok/s"),
                           ("frontier_output_tokens_per_s_per_user", _number(e, "tokens_per_user"), "tok/s")]
            if "op_rate" in e.numbers:
                values += [("operating_requests_per_s_per_replica", _number(e, "op_rate"), "req/s"),
                           ("operating_decode_batch", _number(e, "op_batch"), "sequences"),
                           ("operating_stable", bool(e.numbers["op_stable"]), "bool")]
                values += [(f"operating_{t.key}", _number(e, t.key), "s") for t in targets]
        for metric, value, unit in values:
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            if value is not None:
                rows.append({**base, "metric": metric, "value": value, "unit": unit})
    return rows


def wide_row(spec: ModelSpec, e: Evaluation, targets: tuple[Target, ...], role: str) -> Row:
    """One configuration as one row (the tables, and CSV/JSON summary mode): its settings (with the tables' short
    forms: layout, weights/KV formats, max_num_seqs/chunk), size, cost, capacity and latencies at the operating
    point."""
    c = e.candidate
    row: Row = {"model": spec.name, "role": role, "engine": c.engine, "gpu": c.gpu, "mode": c.mode, "tp": c.tp,
                "pp": c.pp, "ep": c.ep, "dp": c.dp,
                **({"redundant_experts": c.redundant_experts} if c.redundant_experts else {}),
                "layout": layout(e), "weights_dtype": c.weights,
                "kv_dtype": c.kv_dtype,
                "formats": f"{short_dtype(c.weights, spec.native_dtype)}/{short_dtype(c.kv_dtype, '')}",
                "seqs_chunk": f"{c.max_num_seqs}/{c.chunk}",
                "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.chunk,
                "speculative_tokens": c.spec.num_tokens if c.spec else 0, "feasible": e.feasible,
                "reason": e.reason, "replicas": e.replicas or None, "num_gpus": e.num_gpus or None,
                "price_per_gpu_hour": e.price_per_gpu_hour, "cost_per_hour": e.cost_per_hour if e.feasible else None,
                "cost_per_million_input_tokens": _finite(e.cost_per_m_input) if e.feasible else None,
                "cost_per_million_output_tokens": _finite(e.cost_per_m_output) if e.feasible else None,
                "capacity_requests_per_s_per_replica": e.capacity_rate_per_s,
                "kv_capacity_tokens_per_replica": e.memory.kv_capacity_tokens if e.memory else None,
                "binding_constraint": e.binding or None,
                "frontier_output_tokens_per_s_per_gpu": _number(e, "tokens_per_gpu"),
                "frontier_output_tokens_per_s_per_user": _number(e, "tokens_per_user")}
    for t in targets:
        row[f"operating_{t.key}"] = _number(e, t.key)
    return row


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def summary_points(spec: ModelSpec, result: SearchResult, listed: list[Evaluation],
                   targets: tuple[Target, ...]) -> list[Row]:
    """The configurations a person looks at, one row each: the chosen plan, the listed cheapest ones and the Pareto
    frontier (``--points frontier``, the default for CSV/JSON; ``--points all`` writes every point, long format)."""
    rows: list[Row] = []
    chosen = result.best.candidate if result.best is not None else None
    seen: set = set()
    for e in listed:
        rows.append(wide_row(spec, e, targets, "chosen" if e.candidate == chosen else "cheapest"))
        seen.add(e.candidate)
    for e in result.frontier:
        if e.candidate not in seen:
            rows.append(wide_row(spec, e, targets, "frontier"))
            seen.add(e.candidate)
    return rows


def distinct(evaluations: list[Evaluation], limit: int) -> list[Evaluation]:
    """The first (cheapest) evaluation of each GPU, layout and formats, up to ``limit`` of them."""
    seen: set[tuple] = set()
    out = []
    for e in evaluations:
        c = e.candidate
        key = (c.engine, c.gpu, c.tp, c.pp, c.ep, c.weights, c.kv_dtype, c.spec, c.mode)
        if key in seen:
            continue
        seen.add(key)
        out.append(e)
        if len(out) >= limit:
            break
    return out


def frontier_rows(spec: ModelSpec, result: SearchResult, targets: tuple[Target, ...]) -> list[Row]:
    """The Pareto frontier (tokens/s per GPU against tokens/s per user), one row per configuration."""
    return [wide_row(spec, e, targets, "frontier") for e in result.frontier]


def plot_points(result: SearchResult) -> list[Row]:
    """(tokens/s per user, tokens/s per GPU) of every configuration that fits, for the frontier chart."""
    best = result.best
    front = set(map(id, result.frontier))
    return [{"tokens_per_user": e.numbers["tokens_per_user"], "tokens_per_gpu": e.numbers["tokens_per_gpu"],
             "gpu": e.candidate.gpu, "frontier": id(e) in front, "chosen": e is best, "feasible": e.feasible}
            for e in result.evaluations if "tokens_per_user" in e.numbers and e.candidate.mode == "aggregated"]


# --- sentences -----------------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def _unit(c: Candidate) -> str:
    """What one of a candidate's replicas is called: a data-parallel attention rank, or a replica."""
    return "data-parallel rank" if c.dp > 1 else "replica"


def _pool(replicas: int, dp: int, role: str) -> str:
    """A disaggregated pool in words: replicas, or groups of data-parallel ranks."""
    return (f"{replicas // dp} {role} group(s) of {dp} data-parallel rank(s)" if dp > 1 else
            f"{replicas} {role} replica(s)")


def describe(e: Evaluation, spec: ModelSpec) -> str:
    c = e.candidate
    formats = f"weights {c.weights}, KV {c.kv_dtype}"
    if c.mode == "disaggregated":
        return (f"{e.num_gpus} x {c.gpu}: {_pool(c.prefill_replicas, c.prefill_dp, 'prefill')} at "
                f"{c.prefill_layout.replace(' ', '·')} + {_pool(e.replicas, c.dp, 'decode')} at "
                f"{layout(e).split('+D ')[-1]}, {formats}, max_num_seqs {c.max_num_seqs}")
    if c.dp > 1:   # a replica is one data-parallel attention rank; ranks come in groups of dp
        return (f"{e.replicas // c.dp} group(s) of {c.dp} data-parallel rank(s) x {layout(e)} = {e.num_gpus} x "
                f"{c.gpu}, {formats}, max_num_seqs {c.max_num_seqs} and max_num_batched_tokens {c.chunk} per rank")
    return (f"{e.replicas} replica(s) x {layout(e)} = {e.num_gpus} x {c.gpu}, {formats}, max_num_seqs "
            f"{c.max_num_seqs}, max_num_batched_tokens {c.chunk}")


def chosen_sentence(spec: ModelSpec, e: Evaluation, traffic: Traffic, targets: tuple[Target, ...],
                    simulated: dict[str, float] | None = None) -> str:
    """The chosen plan, its cost and each target's value: the simulation's where it confirmed the plan (the model's
    beside it), else the model's."""
    load = (f"{traffic.rate_per_s:g} req/s" if traffic.rate_per_s is not None
            else f"{traffic.concurrency} concurrent requests")
    simulated = simulated or {}

    def value(t: Target) -> str:
        if t.key in simulated:
            return (f"{t.label} {_ms(simulated[t.key])} simulated, {_ms(e.numbers[t.key])} by the model (target "
                    f"{_ms(t.seconds)})")
        return f"{t.label} {_ms(e.numbers[t.key])} (target {_ms(t.seconds)})"

    parts = ", ".join(value(t) for t in targets if t.key in e.numbers)
    return (f"cheapest plan for {spec.name} at {load}: {describe(e, spec)}; ${e.cost_per_hour:,.2f}/h, "
            f"${e.cost_per_m_input:,.3f} per million input and ${e.cost_per_m_output:,.3f} per million output "
            f"tokens; {parts}")


def trust_sentence(gpu: GPUSpec, calibrated: bool) -> str | None:
    """How far to trust the chosen GPU's rates, when its preset's kernels were not measured on it (``measured_on``)."""
    lat = gpu.latency
    if calibrated or lat is None or lat.measured_here:
        return None
    where = ("tfcalc has no kernel measurements of it (published fractions, borrowed floors)"
             if lat.measured_on == "none" else f"its kernel rates were measured on {lat.measured_on}")
    return (f"note: {gpu.name}: {where}, so its plans carry more error than the measured GPUs'; measure it with "
            f"'tfcalc bench calibrate --save calib.json' and pass --calibration calib.json")


def price_sentence(offer: GpuOffer, offers: tuple[GpuOffer, ...]) -> str:
    """Which price the chosen plan is costed at (its kind and date, or --price), and whether the GPUs searched mix
    neocloud and hyperscaler rates, whose gap can decide the choice (presets/prices.yaml)."""
    if not offer.price_kind:
        text = f"price: {offer.gpu.name} at ${offer.price_per_hour:,.3f} per GPU-hour, given with --price"
    else:
        text = (f"price: {offer.gpu.name} at ${offer.price_per_hour:,.3f} per GPU-hour, a {offer.price_kind} rate "
                f"({offer.price_as_of}; presets/prices.yaml)")
    kinds = {o.price_kind for o in offers if o.price_kind}
    if len(kinds) > 1:
        few = sorted(o.gpu.name for o in offers if o.price_kind == "hyperscaler")
        text += (f"; the GPUs searched mix neocloud and hyperscaler rates (hyperscaler: {', '.join(few)}): "
                 "--price-tier neocloud compares like with like")
    return text


def runner_up_sentences(spec: ModelSpec, result: SearchResult, limit: int = 4) -> list[str]:
    """Why the next configurations lose: costlier ones by how much and what binds them; cheaper ones by the
    constraint they break."""
    best = result.best
    lines: list[str] = []
    if best is None:
        return lines
    seen = {(best.candidate.engine, best.candidate.gpu, best.candidate.tp, best.candidate.pp, best.candidate.weights)}
    for e in result.evaluations:
        if len(lines) >= limit:
            break
        c = e.candidate
        key = (c.engine, c.gpu, c.tp, c.pp, c.weights)
        if e is best or key in seen or not e.feasible:
            continue
        seen.add(key)
        extra = e.cost_per_hour - best.cost_per_hour
        unit = _unit(c)
        sign = "+" if extra >= 0 else "-"   # cheaper in the model where the simulation check moved the choice
        lines.append(f"runner-up {describe(e, spec)}: ${e.cost_per_hour:,.2f}/h ({sign}${abs(extra):,.2f}/h): one "
                     f"{unit} carries {e.capacity_rate_per_s:,.2f} req/s before {e.binding} binds, so it needs "
                     f"{e.replicas} {unit}(s) of {c.gpus_per_replica} GPU(s)")
    cheaper = _cheaper_failures(result, best)
    lines.extend(cheaper)
    return lines


def _cheaper_failures(result: SearchResult, best: Evaluation) -> list[str]:
    """The GPU types whose configurations under the chosen plan's cost all fail, with the constraint that stops the
    nearest of them (``nearest_miss``; the three cheapest types per GPU)."""
    out: list[str] = []
    cheaper: dict[str, list[Evaluation]] = {}
    for e in result.evaluations:
        if e.feasible or e.candidate.mode != "aggregated":
            continue
        if e.price_per_gpu_hour * e.candidate.gpus_per_replica >= best.cost_per_hour:
            continue
        cheaper.setdefault(e.candidate.gpu, []).append(e)
    per_gpu = {gpu: miss for gpu, group in cheaper.items() if (miss := nearest_miss(group)) is not None}
    for gpu, e in sorted(per_gpu.items(), key=lambda kv: kv[1].price_per_gpu_hour)[:3]:
        c = e.candidate
        out.append(f"cheaper {gpu} ({layout(e)}, weights {c.weights}) loses: {e.reason}")
    return out


def explain_lines(spec: ModelSpec, e: Evaluation, traffic: Traffic, targets: tuple[Target, ...],
                  space: SearchSpace) -> list[str]:
    """Every term behind the chosen plan, in the order the model computes them."""
    m, mem, op, cap = e.model, e.memory, e.operating, e.capacity
    if m is None or mem is None or op is None:
        return [f"{e.candidate.label}: {e.reason}"]
    gib = 1 << 30
    step = m.step
    w = op.w
    c = e.candidate
    o = m.overheads
    d = getattr(step, "deployment", None)
    kernels = (f"per-operation latency model ({d.gpu.name}, {d.rates_decode.source}; the engine's kernels: CUDA "
               f"graphs {'on' if d.kernels.cuda_graphs else 'off'}), tp {d.tp} pp {d.pp} ep {d.ep}" if d is not None
               else step.label)
    lines = [
        f"configuration: {describe(e, spec)} at ${e.price_per_gpu_hour:,.3f} per GPU-hour",
        f"memory per GPU ({mem.engine}): weights {mem.weights_bytes_per_gpu / gib:,.2f} GiB, reserved "
        f"{mem.reserved_bytes_per_gpu / gib:,.2f} GiB (the engine's fraction, activation peak of {c.chunk} tokens and "
        f"{c.max_num_seqs} sampled rows, CUDA graphs), KV budget {mem.kv_budget_bytes_per_gpu / gib:,.2f} GiB = "
        f"{mem.kv_capacity_tokens:,} tokens in blocks of {mem.block_size} "
        f"({mem.kv_bytes_per_token_per_gpu:,} B per token per GPU)",
        f"traffic: prompts {traffic.input_len.label} tokens (prefix-cache hits {traffic.prefix_hit_ratio:.0%}), "
        f"outputs {traffic.output_len.label} tokens; per {_unit(c)} "
        + (f"{op.rate_per_s:,.3f} req/s" if traffic.rate_per_s is not None else
           f"{(traffic.concurrency or 0) / e.replicas:,.1f} concurrent requests ({op.rate_per_s:,.3f} req/s)"),
        f"step time: {kernels}; tabulated over (decoding sequences x prefill tokens) at the mean context "
        f"{w.decode_context:,.0f}",
        f"API server ({o.api_servers} process(es)): {_ms(o.api_request_s)} per request + "
        f"{o.api_token_s * 1e6:,.0f} us per streamed chunk ({w.chunks:,.0f} chunks) = {_ms(w.api_work)} of serial "
        f"work; utilization {op.api_utilization:.0%}, delay {_ms(op.api_delay_s)} to the engine and back, "
        f"{_ms(op.api_wait_s)} of it queueing (random: percentiles spread it) ({o.source})",
        (f"busy steps carry {op.batch:,.1f} decoding sequences; {op.prefill_step_share:.0%} of them also a prefill "
         f"chunk of {op.chunk_tokens:,.0f} tokens (room for {op.prefill_capacity:,.0f}); decode step "
         f"{_ms(op.decode_step_s)}, prefill step {_ms(op.prefill_step_s)}"
         if not m.policy.prefill_first else
         f"decode steps carry {op.batch:,.1f} sequences; {op.prefill_step_share:.0%} of them come after a prefill "
         f"step of {op.chunk_tokens:,.0f} tokens (room for {op.prefill_capacity:,.0f}; SGLang: prefill first, "
         f"decode waits); decode step {_ms(op.decode_step_s)}, {_ms(op.prefill_step_s)} with the prefill step")
        + f", mean {_ms(op.step_s)}; engine busy {op.busy:.0%} of the time",
        f"seats: min(max_num_seqs {c.max_num_seqs}, KV for {op.kv_seats:,.0f} live sequences) = {op.seats:,.0f}; "
        f"load {op.seat_load:,.1f}; prefill queue utilization {op.prefill_utilization:.0%}; P(wait) "
        f"{op.wait_probability:.1%}, mean wait {_ms(op.wait_mean_s)}",
        f"TTFT = request latency {_ms(m.overheads.front_s(traffic.input_len.mean))} + API server "
        f"{_ms(op.api_delay_s)} + wait {_ms(op.wait_mean_s)} "
        f"+ rest of the running step {_ms(op.busy * op.step_s / 2)} + prefill "
        f"{_ms(op._prefill_service(w.prefill_mean))} + stream {_ms(m.overheads.stream_s)} = {_ms(op.ttft(0))} "
        "(mean)",
        f"TPOT = step time at the batch a request sees ({1 + op.decode_others:,.1f} sequences) / "
        f"{w.accepted:.2f} tokens per step = {_ms(op.tpot(0))} (mean)",
    ]
    for t in targets:
        lines.append(f"{t.label}: {_ms(op.metric(t))} at the operating point (target {_ms(t.seconds)})")
    if cap is not None:
        from tfcalc.calc.capacity import replicas_needed

        unit = _unit(c)
        modelled, _ = replicas_needed(cap, traffic, c.dp)
        checked = f"; {e.replicas} after the simulation check" if modelled != e.replicas else ""
        lines.append(f"capacity: one {unit} carries {cap.rate_per_s:,.3f} req/s before {cap.binding} binds "
                     f"(decode batch {cap.point.batch:,.1f}); {unit}s = ceil({traffic.load:g} / "
                     f"{e.capacity_rate_per_s if traffic.rate_per_s is not None else e.capacity_concurrency:,.3f})"
                     + (f", rounded up to groups of {c.dp}" if c.dp > 1 else "") + f" = {modelled}{checked}")
    lines.append(f"cost: {format_count(e.num_gpus, 'GPU')} x ${e.price_per_gpu_hour:,.3f} = "
                 f"${e.cost_per_hour:,.2f}/h; per million tokens ${e.cost_per_m_input:,.3f} input, "
                 f"${e.cost_per_m_output:,.3f} output (GPU time split by prefill's share of step time)")
    if m.spec is not None:
        lines.append(f"speculative decoding: {m.spec.num_tokens} draft tokens, acceptance {m.spec.acceptance}, "
                     f"{m.spec.tokens_per_step:.2f} tokens per verification step")
    return lines


# --- engine command lines -----------------------------------------------------------------------------


def _quantization(weights: str, native: str) -> tuple[str | None, str | None]:
    """(vLLM/SGLang --quantization value, a note on the checkpoint needed) for a weight format."""
    if weights == native:
        return None, None
    if weights.startswith("fp8"):
        return "fp8", None
    if weights.startswith("int4"):
        return None, "serve an AWQ or GPTQ int4 checkpoint of the model (the engine detects its format)"
    if weights.startswith("int8-"):
        return None, "serve a GPTQ int8 checkpoint of the model (the engine detects its format)"
    if weights == "int8":
        return None, "serve a W8A8 int8 checkpoint (compressed-tensors) of the model"
    if weights in ("nvfp4", "mxfp4"):
        return None, f"serve an {weights} checkpoint of the model"
    if weights == "nf4":  # quantised in flight, or a bitsandbytes checkpoint the engine detects
        return "bitsandbytes", None
    return None, None


def host_gpus(c: Candidate, space: SearchSpace) -> int:
    """GPUs one host drives: the GPU preset's (a GB200 compute tray's 4) or ``space.gpus_per_node``."""
    return space.offer(c.gpu).gpu.gpus_per_host or space.gpus_per_node


def instance_nodes(c: Candidate, space: SearchSpace) -> int:
    """Hosts one data-parallel-attention instance spans (1 for other plans): nodes of ``space.gpus_per_node`` GPUs,
    or the GPU's own hosts (``host_gpus``)."""
    return math.ceil(c.tp * c.dp / host_gpus(c, space)) if c.dp > 1 else 1


def vllm_command(model_path: str, spec: ModelSpec, e: Evaluation, space: SearchSpace, prefix_caching: bool,
                 draft_model: str = "DRAFT_MODEL", api_servers: int = 1) -> list[str]:
    """``vllm serve`` for one replica (lines to join with a backslash), and how many to run."""
    c = e.candidate
    chosen = searched_engine(space, c.engine)   # the candidate's vLLM, else the searched one (another engine chosen)
    engine = chosen if chosen is not None and chosen.name == "vllm" else _engine_of("vllm", space)
    env = (f"VLLM_USE_V2_MODEL_RUNNER={int(engine.runner.upper() == 'V2')} "
           if engine is not None and engine.runner_forced else "")
    args = [f"{env}vllm serve {shlex.quote(model_path)}", f"--tensor-parallel-size {c.tp}"]
    if spec.remote_code:
        args.append("--trust-remote-code")
    if c.pp > 1:
        args.append(f"--pipeline-parallel-size {c.pp}")
    if c.dp > 1:   # each data-parallel rank its own scheduler: max_num_seqs and the token budget are per rank
        args.append(f"--data-parallel-size {c.dp}")
    if instance_nodes(c, space) > 1:  # the head node's line; the others add --headless --data-parallel-start-rank
        args += [f"--data-parallel-size-local {max(host_gpus(c, space) // c.tp, 1)}",
                 "--data-parallel-address HEAD_NODE_IP", "--all2all-backend deepep_low_latency"]
    if c.ep > 1:
        args.append("--enable-expert-parallel")
    if c.redundant_experts:
        args += ["--enable-eplb", f"--eplb-config '{json.dumps({'num_redundant_experts': c.redundant_experts})}'"]
    args += [f"--max-model-len {space.max_model_len}", f"--max-num-seqs {c.max_num_seqs}",
             f"--max-num-batched-tokens {c.chunk}"]
    if space.gpu_memory_utilization is not None:
        args.append(f"--gpu-memory-utilization {space.gpu_memory_utilization}")
    if space.block_size is not None:
        args.append(f"--block-size {space.block_size}")
    if space.kv_cache_memory_bytes is not None and takes_kv_cache_memory(engine):
        args.append(f"--kv-cache-memory-bytes {space.kv_cache_memory_bytes}")
    if api_servers > 1:
        args.append(f"--api-server-count {api_servers}")
    if c.kv_dtype.startswith("fp8"):
        args.append("--kv-cache-dtype fp8")
    la = spec.linear_attention
    if la is not None and la.kind == "mamba2" and la.recurrent_state_dtype == "fp32":
        args.append("--mamba-ssm-cache-dtype float32")  # the plan's fp32 SSM states (vLLM's auto: the model dtype)
    quant, _ = _quantization(c.weights, spec.native_dtype)
    if quant:
        args.append(f"--quantization {quant}")
    args.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    if c.spec is not None:
        config = {"method": "eagle", "model": draft_model, "num_speculative_tokens": c.spec.num_tokens}
        args.append(f"--speculative-config '{json.dumps(config, separators=(',', ':'))}'")  # fits 100 columns
    if engine is not None and engine.extensible_forced_off:
        args.append("--no-enable-extensible-kv-cache")
    if c.mode == "disaggregated":
        args.append("--kv-transfer-config '{\"kv_connector\": \"NixlConnector\", \"kv_role\": \"kv_both\"}'")
    return args


def sglang_command(model_path: str, spec: ModelSpec, e: Evaluation, space: SearchSpace, prefix_caching: bool,
                   draft_model: str = "DRAFT_MODEL") -> list[str]:
    c = e.candidate
    # with DP attention --tp counts every GPU of the instance and --max-running-requests every rank's requests
    args = ["python -m sglang.launch_server", f"--model-path {shlex.quote(model_path)}", f"--tp {c.tp * c.dp}"]
    if spec.remote_code:
        args.append("--trust-remote-code")
    if c.pp > 1:
        args.append(f"--pp-size {c.pp}")
    if c.dp > 1:
        args += [f"--dp {c.dp}", "--enable-dp-attention"]
    if c.ep > 1:
        args.append(f"--ep-size {c.ep}")
    if c.dp > 1 and c.ep > 1:  # DeepEP's all-to-all, as priced (without it the dp ranks gather every token)
        args.append("--moe-a2a-backend deepep")
    if c.redundant_experts:
        args += ["--enable-eplb", f"--ep-num-redundant-experts {c.redundant_experts}"]
    nodes = instance_nodes(c, space)
    if nodes > 1:  # node 0's line; the others run it with their --node-rank
        args += [f"--nnodes {nodes}", "--node-rank 0", "--dist-init-addr HEAD_NODE_IP:5000"]
    args += [f"--context-length {space.max_model_len}", f"--max-running-requests {c.max_num_seqs * c.dp}",
             f"--chunked-prefill-size {c.chunk}"]
    if space.gpu_memory_utilization is not None:
        args.append(f"--mem-fraction-static {space.gpu_memory_utilization}")
    if space.block_size is not None and space.block_size > 1:
        args.append(f"--page-size {space.block_size}")
    if c.kv_dtype.startswith("fp8"):
        args.append("--kv-cache-dtype fp8_e4m3")
    quant, _ = _quantization(c.weights, spec.native_dtype)
    if quant:
        args.append(f"--quantization {quant}")
    if not prefix_caching:
        args.append("--disable-radix-cache")
    if any(eng is not None and eng.name == "sglang" and not eng.scheduler.prefill_first for eng in space.engines):
        args.append("--enable-mixed-chunk")
    if c.spec is not None:
        args += ["--speculative-algorithm EAGLE", f"--speculative-draft-model-path {draft_model}",
                 f"--speculative-num-steps {c.spec.num_tokens}", "--speculative-eagle-topk 1",
                 f"--speculative-num-draft-tokens {c.spec.num_tokens + 1}"]
    if c.mode == "disaggregated":
        args.append("--disaggregation-mode decode")
    return args


def trtllm_command(model_path: str, spec: ModelSpec, e: Evaluation, space: SearchSpace, prefix_caching: bool,
                   draft_model: str = "DRAFT_MODEL") -> tuple[list[str], dict]:
    """``trtllm-serve`` (PyTorch backend) for one replica, and the contents of the YAML file its
    --extra_llm_api_options names: the KV-cache format, block reuse and speculation go there."""
    c = e.candidate
    args = [f"trtllm-serve {shlex.quote(model_path)}", "--backend pytorch", f"--tp_size {c.tp * c.dp}"]
    if spec.remote_code:
        args.append("--trust_remote_code")
    if c.pp > 1:
        args.append(f"--pp_size {c.pp}")
    if c.ep > 1:
        args.append(f"--ep_size {c.ep}")
    args += [f"--max_batch_size {c.max_num_seqs}", f"--max_num_tokens {c.chunk}",
             f"--max_seq_len {space.max_model_len}"]
    if space.gpu_memory_utilization is not None:
        args.append(f"--kv_cache_free_gpu_memory_fraction {space.gpu_memory_utilization}")
    kv_cache: dict = {"enable_block_reuse": prefix_caching}
    if c.kv_dtype.startswith("fp8"):
        kv_cache["dtype"] = "fp8"
    extra: dict = {"kv_cache_config": kv_cache, "enable_chunked_prefill": True}
    if c.dp > 1:   # attention data-parallel over the tp_size ranks (at tp 1 each), the experts over ep_size
        extra["enable_attention_dp"] = True
    if c.redundant_experts:   # its load balancer's slots: the experts and their replicas
        extra["moe_config"] = {"load_balancer": {"num_slots": spec.moe.num_experts + c.redundant_experts}}
    if c.spec is not None:
        extra["speculative_config"] = {"decoding_type": "Eagle", "max_draft_len": c.spec.num_tokens,
                                       "speculative_model_dir": draft_model}
    args.append("--extra_llm_api_options extra.yml")
    return args, extra


def _yaml(value: object) -> str:
    """A value in YAML's flow style (mappings of identifiers, numbers and booleans, as the engines' options are)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _yaml_entry(key: str, value: object, indent: str, width: int = 100) -> str:
    """``key: value`` under ``indent``, a mapping in flow style where the line fits ``width``, else as a block."""
    line = f"\n{indent}{key}: {_yaml(value)}"
    if len(line) - 1 <= width or not isinstance(value, dict):
        return line
    return f"\n{indent}{key}:" + "".join(_yaml_entry(k, v, indent + "  ", width) for k, v in value.items())


def launch_lines(model_path: str, spec: ModelSpec, e: Evaluation, space: SearchSpace,
                 prefix_caching: bool, api_servers: int = 1) -> tuple[str, list[str]]:
    """(what to run, in a sentence; each engine's command for the chosen plan, its own engine's first, one flag per
    line, to print as they are: a shell line cannot be re-wrapped)."""
    c = e.candidate
    online, note = _quantization(c.weights, spec.native_dtype)
    nodes = instance_nodes(c, space)
    across = (f", each across {nodes} nodes (the same command on every node: SGLang with its --node-rank, vLLM's "
              f"others with --headless --data-parallel-start-rank)" if nodes > 1 else "")
    replicas = (f"run {_pool(c.prefill_replicas, c.prefill_dp, 'prefill')} at "
                f"{c.prefill_layout.replace(' ', '·')} (SGLang --disaggregation-mode prefill) and "
                f"{_pool(e.replicas, c.dp, 'decode')} as below{across}, with a disaggregation router"
                if c.mode == "disaggregated" else
                f"run {e.replicas // c.dp} instance(s) of {c.dp * c.gpus_per_replica} GPUs ({c.dp} data-parallel "
                f"attention ranks of tp {c.tp} sharing the experts at ep {c.ep}){across} behind a load balancer"
                if c.dp > 1 else
                f"run {e.replicas} replica(s) of {c.gpus_per_replica} GPU(s) behind a load balancer")
    trtllm, extra = trtllm_command(model_path, spec, e, space, prefix_caching)
    indent = " " * 9
    # vLLM and SGLang quantise a 16-bit checkpoint online (--quantization); trtllm-serve cannot
    trtllm_note = (f"\n{indent}(serve a pre-quantized {c.weights} checkpoint, e.g. ModelOpt's:"
                   f"\n{indent} trtllm-serve does not quantize a 16-bit one)") if online else ""
    if c.dp > 1 and c.tp > 1:
        trtllm_note += (f"\n{indent}(its attention DP runs attention at tp 1 on each of the {c.tp * c.dp} GPUs,"
                        f"\n{indent} not at tp {c.tp} as planned)")
    commands = {
        "vllm": ("vLLM:   ", vllm_command(model_path, spec, e, space, prefix_caching, api_servers=api_servers), ""),
        "sglang": ("SGLang: ", sglang_command(model_path, spec, e, space, prefix_caching), ""),
        "trtllm": ("TRT-LLM:", trtllm, f"\n{indent}extra.yml:" + "".join(_yaml_entry(k, v, indent + "  ")
                                                                         for k, v in extra.items())
                    + trtllm_note),
    }
    family = c.engine.split()[0]
    precision = next(p for p in space.weight_precisions if p.label == c.weights)
    for other in [f for f in commands if f != family]:  # an engine that cannot serve these weights gets no command
        if (why := unserved_format(_engine_of(other, space), precision)) is not None:
            commands[other] = (commands[other][0], [f"({why})"], "")
    lines = [f"{label} " + f" \\\n{indent}".join(args) + after
             for _, (label, args, after) in sorted(commands.items(), key=lambda item: item[0] != family)]
    chosen = searched_engine(space, c.engine)
    if c.mode == "disaggregated" and chosen is not None and chosen.extensible_off is not None:
        note = ((f"{note}; " if note else "") + f"{chosen.label} keeps its extensible KV cache off under "
                "NixlConnector on hosts without an IMEX channel: there, plan with --no-enable-extensible-kv-cache")
    return f"launch: {replicas}" + (f"; {note}" if note else ""), lines


def _engine_of(family: str, space: SearchSpace) -> EngineSpec:
    """The searched engine of ``family``, else its current preset."""
    from tfcalc.spec.presets import load_engine

    searched = [e for e in space.engines if e is not None and e.name.split()[0] == family]
    return searched[0] if searched else load_engine(family)


def launch_command(model_path: str, spec: ModelSpec, e: Evaluation, space: SearchSpace, prefix_caching: bool,
                   api_servers: int = 1) -> str:
    """The chosen engine's command on one line (a CSV/JSON field; TensorRT-LLM's options file is left out)."""
    family = e.candidate.engine.split()[0]
    if family == "sglang":
        args = sglang_command(model_path, spec, e, space, prefix_caching)
    elif family == "trtllm":
        args = trtllm_command(model_path, spec, e, space, prefix_caching)[0]
    else:
        args = vllm_command(model_path, spec, e, space, prefix_caching, api_servers=api_servers)
    return " ".join(args)
