"""Capacity search: every replica layout on every GPU type, sized to the traffic, cheapest first.

A candidate is one replica configuration: engine x GPU type x tensor parallel tp x pipeline parallel pp x expert
parallel ep (1, or tp: whole experts per GPU, or tp x dp: dp data-parallel attention ranks sharing the experts, each
rank a replica and the replicas in whole groups of dp) x weight format x KV format x max_num_seqs x chunk size
(max_num_batched_tokens) [x speculative decoding on/off]. Step times come from the per-operation latency model of
``estimate`` with the engine's kernels (``serving_inputs.latency_step``, built once per engine, GPU, layout and
formats). For each:

1. memory (``serving_inputs.replica_memory``: ``plan_fit`` with the engine's memory model): does it load, how much
   KV the replica holds for this max_num_seqs and chunk size; layouts that do not fit are pruned before any timing;
2. capacity (``serving.max_rate``): the largest request rate one replica carries while meeting every target,
   and what binds it;
3. sizing: replicas = ceil(traffic / capacity) (data parallel), GPUs = replicas x tp x pp, cost = GPUs x
   hourly price; infeasible when even a lone request misses a target or the GPUs exceed the limit.

Cost per million tokens splits each GPU-hour between prefill and decode by their share of step time at the
operating point. The Pareto frontier is taken over every configuration that fits, each at the most traffic it
carries within the TTFT and end-to-end targets (the TPOT target is the frontier chart's vertical line):
tokens/s per GPU vs tokens/s per user (1 / TPOT). Disaggregated serving sizes a prefill pool (TTFT) and a
decode pool (TPOT) separately, with the prompt's KV sent between them.

Because replicas = ceil(load / capacity) and a configuration's capacity does not depend on the load or on
prices: more traffic never needs fewer GPUs of a type, looser targets never cost more, and a lower price
never makes a feasible plan infeasible (tests/calc/test_capacity.py checks all three). Pure math: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from tfcalc.calc.engine import takes_kv_cache_memory, unserved_format
from tfcalc.calc.kernels import UNIFORM, Routing
from tfcalc.calc.serving import (
    HALFIN_WHITT,
    Capacity,
    Point,
    ReplicaServing,
    SpecDecoding,
    at_concurrency,
    at_rate,
    capacity_index,
    load_limit,
    max_rate,
    max_rates,
    prefill_only_at,
    prefill_only_max_rate,
)
from tfcalc.calc.serving_inputs import ReplicaMemory, StepSource, latency_step, replica_memory
from tfcalc.calc.serving_traffic import Overheads, Target, Traffic, engine_overheads
from tfcalc.calc.shard import Parallelism, attention_ranks, check_weight_blocks, layout_redundant_experts
from tfcalc.dtypes import DType, WeightPrecision
from tfcalc.errors import UsageError
from tfcalc.spec.engine import EngineSpec, SchedulerPolicy
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec

DEFAULT_MAX_NUM_SEQS = (8, 16, 32, 64, 128, 256, 512)
DEFAULT_CHUNKS = (512, 2048, 8192)


@dataclass(frozen=True, kw_only=True)
class GpuOffer:
    gpu: GPUSpec
    price_per_hour: float
    price_source: str = ""
    price_kind: str = ""      # who sells at the rate (spec.prices.PROVIDER_KINDS); "" for a --price
    price_as_of: str = ""     # when the rate was read


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """What may vary, and the limits."""

    gpus: tuple[GpuOffer, ...]
    weight_precisions: tuple[WeightPrecision, ...]
    kv_dtypes: tuple[DType, ...]
    tps: tuple[int, ...] = ()              # empty: every tp up to gpus_per_node that the model allows
    pps: tuple[int, ...] = (1,)
    expert_parallel: tuple[bool, ...] = (False, True)
    attention_dp: tuple[int, ...] = (1,)   # data-parallel attention ranks sharing the experts (MoE, ep = tp x dp)
    max_num_seqs: tuple[int, ...] = DEFAULT_MAX_NUM_SEQS
    chunk_sizes: tuple[int, ...] = DEFAULT_CHUNKS
    engines: tuple[EngineSpec | None, ...] = (None,)   # None: the ideal memory arithmetic, default kernels
    # per engine, the weight formats (WeightPrecision labels) searched with it; None: every one (a float32
    # checkpoint is served in 16 bits by vLLM and SGLang but as it is by TensorRT-LLM: weights.float32_as)
    engine_weights: tuple[frozenset[str], ...] | None = None
    engine_kv: tuple[frozenset[str], ...] | None = None  # the same for KV formats (DType names)
    max_gpus: int = 64
    gpus_per_node: int = 8
    max_model_len: int = 8192
    gpu_memory_utilization: float | None = None      # None: each engine's default
    block_size: int | None = None                    # None: each engine's default
    kv_cache_memory_bytes: int | None = None         # vLLM's KV cache per GPU, set outright (engines that take it)
    speculative: tuple[SpecDecoding | None, ...] = (None,)
    disaggregated: bool = False
    kv_transfer_bytes_per_s: float = 50e9
    routing: Routing = UNIFORM                        # how MoE tokens pick experts (kernels.Routing)
    redundant_experts: int = 0                        # EPLB's replicas on every layout with whole experts per GPU
    rates: Callable | None = field(default=None, compare=False)   # (gpu, base rates, phase) -> Rates: calibration

    def redundant_for(self, tp: int, ep: int) -> int:
        """The redundant experts a layout holds (``shard.layout_redundant_experts``)."""
        return layout_redundant_experts(self.redundant_experts, tp, ep)

    def offer(self, gpu_name: str) -> GpuOffer:
        """The offer of the GPU a candidate names."""
        return next(o for o in self.gpus if o.gpu.name == gpu_name)


def engine_label(engine: EngineSpec | None) -> str:
    return engine.label if engine is not None else "ideal"


def scheduler_policy(engine: EngineSpec | None) -> SchedulerPolicy:
    """How a planned replica fills a step: its engine's policy with chunked prefill on, as the launch command the
    plan prints sets it (TensorRT-LLM defaults it off; the command's extra options turn enable_chunked_prefill on,
    tfcalc.report.capacity); no engine: vLLM's policy, chunked prefill beside the decodes."""
    return replace(engine.scheduler, chunked_prefill=True) if engine is not None else SchedulerPolicy()


def engine_family(engine: EngineSpec | None) -> str:
    return engine.name if engine is not None else "ideal"


@dataclass(frozen=True, kw_only=True)
class Candidate:
    gpu: str
    engine: str = "ideal"
    tp: int
    pp: int
    ep: int
    weights: str
    kv_dtype: str
    max_num_seqs: int
    chunk: int
    spec: SpecDecoding | None = None
    mode: str = "aggregated"      # or "disaggregated" (then the fields describe the decode pool)
    prefill_tp: int = 0
    prefill_replicas: int = 0
    prefill_ep: int = 0           # the prefill pool's ep (0: no expert parallelism beyond its tp)
    redundant_experts: int = 0    # EPLB's expert replicas the layout holds (SearchSpace.redundant_for)

    @property
    def dp(self) -> int:
        """Data-parallel attention ranks that share the experts (ep > tp); each rank is one replica here (its own
        scheduler, max_num_seqs and KV pool), and replicas come in groups of dp."""
        return attention_ranks(self.tp, self.ep)

    @property
    def prefill_dp(self) -> int:
        """Data-parallel attention ranks of the prefill pool's groups (disaggregated plans)."""
        return attention_ranks(self.prefill_tp, self.prefill_ep) if self.prefill_tp else 1

    @property
    def prefill_layout(self) -> str:
        """The prefill pool's layout in the decode's notation: tp1 dp32 ep32, or tp8."""
        dp = f" dp{self.prefill_dp}" if self.prefill_dp > 1 else ""
        return f"tp{self.prefill_tp}{dp}" + (f" ep{self.prefill_ep}" if self.prefill_ep > 1 else "")

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def label(self) -> str:
        ep = ((f" dp{self.dp}" if self.dp > 1 else "") + (f" ep{self.ep}" if self.ep > 1 else "")
              + (f"+{self.redundant_experts}r" if self.redundant_experts else ""))
        pp = f" pp{self.pp}" if self.pp > 1 else ""
        spec = f" spec{self.spec.num_tokens}" if self.spec else ""
        pre = f" +{self.prefill_replicas}x {self.prefill_layout} prefill" if self.mode == "disaggregated" else ""
        return (f"{self.engine} {self.gpu} tp{self.tp}{pp}{ep} w={self.weights} kv={self.kv_dtype} "
                f"seqs={self.max_num_seqs} chunk={self.chunk}{spec}{pre}")


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """One candidate sized to the traffic."""

    candidate: Candidate
    fits: bool
    feasible: bool
    reason: str                     # why infeasible, or what binds the replica's capacity when feasible
    price_per_gpu_hour: float
    memory: ReplicaMemory | None = None
    capacity_rate_per_s: float = 0.0        # per replica, within all targets
    capacity_concurrency: float = 0.0       # per replica, within all targets (Little's law)
    binding: str = ""
    replicas: int = 0
    num_gpus: int = 0
    cost_per_hour: float = 0.0
    operating: Point | None = None          # at the traffic's share per replica
    frontier: Point | None = None           # at the most traffic within the TTFT / end-to-end targets
    cost_per_m_input: float = 0.0
    cost_per_m_output: float = 0.0
    model: ReplicaServing | None = field(default=None, repr=False)
    prefill: Evaluation | None = field(default=None, repr=False)
    capacity: Capacity | None = field(default=None, repr=False)
    frontier_capacity: Capacity | None = field(default=None, repr=False)
    # The numbers reports need, kept when the objects above are dropped (results of worker processes):
    # metric keys of the targets at the operating point, tokens_per_gpu / tokens_per_user at the frontier point,
    # op_rate / op_batch / op_stable.
    numbers: dict[str, float] = field(default_factory=dict, compare=False, repr=False)

    @property
    def sort_key(self) -> tuple:
        return (not self.feasible, self.cost_per_hour if self.feasible else math.inf, self.num_gpus,
                # ties: the most traffic per replica, a data-parallel candidate's whole group of ranks
                -self.capacity_rate_per_s * self.candidate.dp, self.candidate.label)


def _with_numbers(e: Evaluation, targets: tuple[Target, ...]) -> Evaluation:
    numbers: dict[str, float] = {}
    if e.operating is not None:
        op = e.operating
        numbers.update({t.key: op.metric(t) for t in targets})
        numbers.update(op_rate=op.rate_per_s, op_batch=op.batch, op_stable=float(op.stable))
    if e.frontier is not None:
        numbers.update(tokens_per_gpu=tokens_per_gpu(e), tokens_per_user=tokens_per_user(e.frontier))
    return replace(e, numbers=numbers)


def nearest_miss(evaluations: Iterable[Evaluation]) -> Evaluation | None:
    """The failing candidate nearest to serving: one that fits and carries the most traffic within the targets,
    else the one whose weights leave the most KV budget per GPU (the smallest shortfall); None without either."""
    failing = [e for e in evaluations if not e.feasible]
    fitting = [e for e in failing if e.fits]
    if fitting:
        return max(fitting, key=lambda e: e.capacity_rate_per_s)
    sized = [e for e in failing if e.memory is not None]
    return max(sized, key=lambda e: e.memory.kv_budget_bytes_per_gpu, default=None)  # type: ignore[union-attr]


def slim(e: Evaluation) -> Evaluation:
    """The evaluation without its model objects (numbers only): what a worker process sends back."""
    return replace(e, model=None, operating=None, frontier=None, capacity=None, frontier_capacity=None)


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    evaluations: tuple[Evaluation, ...]     # every candidate, cheapest feasible first
    best: Evaluation | None
    frontier: tuple[Evaluation, ...]        # Pareto-optimal: tokens/s per GPU vs tokens/s per user
    candidates: int                          # configurations considered (before pruning by fit)


def _layouts(spec: ModelSpec, space: SearchSpace, reasons: list[str] | None = None) -> list[tuple[int, int, int]]:
    """(tp, pp, ep) allowed by the model: tp within a node, ep 1 or tp (whole experts per GPU), or for an MoE
    model without pipeline stages ep = tp x dp with dp data-parallel attention ranks (``attention_dp``), across
    nodes where tp x dp is more than a node (the all-to-all crosses the network beyond the GPU's NVLink domain).
    ``reasons`` collects why the layouts left out were refused."""
    from tfcalc.calc.plan import check_parallelism

    tps = space.tps or tuple(t for t in (1, 2, 4, 8, 16) if t <= space.gpus_per_node)
    out = []
    for tp in tps:
        for pp in space.pps:
            if tp * pp > space.max_gpus:
                continue
            eps = sorted({tp if (ep and spec.moe is not None and tp > 1) else 1 for ep in space.expert_parallel})
            for ep in eps:
                try:
                    check_parallelism(spec, tp * pp, tp, pp, ep, space.redundant_for(tp, ep))
                except UsageError as refused:
                    if reasons is not None:
                        reasons.append(str(refused))
                    continue
                out.append((tp, pp, ep))
            for dp in sorted(d for d in set(space.attention_dp) if d > 1):
                if spec.moe is None or pp > 1 or tp * dp > space.max_gpus:
                    continue
                try:
                    check_parallelism(spec, tp * dp, tp, 1, tp * dp, space.redundant_for(tp, tp * dp))
                except UsageError:
                    continue
                out.append((tp, 1, tp * dp))
    return out


def count_candidates(spec: ModelSpec, space: SearchSpace) -> int:
    per_layout = (len(space.gpus) * len(space.weight_precisions) * len(space.kv_dtypes) * len(space.max_num_seqs)
                  * len(space.chunk_sizes) * len(space.speculative) * len(space.engines))
    return len(_layouts(spec, space)) * per_layout


def _targets_without_tpot(targets: tuple[Target, ...]) -> tuple[Target, ...]:
    """The targets the frontier keeps: all but the per-user speed ones (TPOT, ITL), its x axis."""
    return tuple(t for t in targets if t.metric not in ("tpot", "itl"))


def _cost_split(point: Point, cost_per_hour: float, rate_per_s: float, traffic_in: float,
                traffic_out: float) -> tuple[float, float]:
    """$ per million input and output tokens: the GPU-hour split by prefill's share of step time."""
    if rate_per_s <= 0:
        return math.inf, math.inf
    extra = point.prefill_step_share * max(point.prefill_step_s - point.decode_step_s, 0.0)
    share = min(extra / point.step_s, 1.0) if point.step_s > 0 else 0.0
    per_s = cost_per_hour / 3600
    cin = per_s * share / (rate_per_s * traffic_in) * 1e6 if traffic_in else 0.0
    cout = per_s * (1 - share) / (rate_per_s * traffic_out) * 1e6
    return cin, cout


Overheading = Overheads | dict[str, Overheads] | None


def overheads_for(overheads: Overheading, engine: EngineSpec | None) -> Overheads:
    """The overheads of an engine: one set for every engine, a set per engine label or family, or (None) the
    engine preset's own (its ``requests:`` block, ``serving_traffic.engine_overheads``)."""
    if isinstance(overheads, Overheads):
        return overheads
    if overheads:
        for key in (engine_label(engine), engine_family(engine)):
            if key in overheads:
                return overheads[key]
    return engine_overheads(engine)


def search(spec: ModelSpec, traffic: Traffic, targets: tuple[Target, ...], space: SearchSpace,
           overheads: Overheading = None, progress: Callable[[int], None] | None = None,
           workers: int = 1, operating: bool = True) -> SearchResult:
    """Evaluate every candidate; the cheapest feasible one first (ties: fewer GPUs, more headroom).

    ``workers`` > 1 spreads the (engine, layout, formats) groups over that many forked processes (where the
    platform can fork); the result is the same as with one. ``operating=False`` leaves out the operating points
    (``full_evaluation`` adds one to a configuration on demand).
    """
    if not space.gpus:
        raise UsageError("no GPU type to search")
    if not targets:
        raise UsageError("give at least one latency target (--ttft, --tpot, --itl or --e2e)")
    reasons: list[str] = []
    layouts = _layouts(spec, space, reasons)
    if not layouts:
        raise UsageError(f"no tensor/pipeline-parallel layout of {spec.name} fits the limits (max GPUs "
                         f"{space.max_gpus}, {space.gpus_per_node} per node)" + (f": {reasons[0]}" if reasons else ""))
    loadable = [(tp, pp, ep, precision) for tp, pp, ep in layouts for precision in space.weight_precisions
                if _whole_blocks(spec, tp, ep, precision) is None]
    if not loadable:
        tp, _, ep = layouts[0]
        raise UsageError(_whole_blocks(spec, tp, ep, space.weight_precisions[0]) or "no layout")
    groups = [(e, tp, pp, ep, precision, kv_dtype) for e in range(len(space.engines)) for tp, pp, ep, precision
              in loadable for kv_dtype in space.kv_dtypes if unserved_format(space.engines[e], precision) is None
              and (space.engine_weights is None or precision.label in space.engine_weights[e])
              and (space.engine_kv is None or kv_dtype.name in space.engine_kv[e])]
    if not groups:
        raise UsageError(next((why for e in space.engines for p in space.weight_precisions
                               if (why := unserved_format(e, p)) is not None), "no engine serves these formats"))
    pool, others = _executor(workers, len(groups))
    job = _Job(spec, traffic, targets, space, overheads, slim=pool is not None, operating=operating)
    evaluations: list[Evaluation] = []
    done = 0
    finished = False
    try:
        for chunk in _pooled(pool, job.run, groups) if pool is not None else map(job.run, groups):
            evaluations.extend(chunk)
            done += len(chunk)
            if progress:
                progress(done)
        finished = True
    finally:
        if pool is not None:
            if finished:
                pool.shutdown()
            else:   # Ctrl-C, SIGTERM or an error: stop the workers now
                _stop_workers(pool, others)
    if space.disaggregated:
        evaluations.extend(_disaggregated(spec, traffic, targets, space, overheads, evaluations))
    evaluations.sort(key=lambda e: e.sort_key)
    best = evaluations[0] if evaluations and evaluations[0].feasible else None
    frontier = pareto_frontier([e for e in evaluations if "tokens_per_user" in e.numbers
                                and e.candidate.mode == "aggregated"])
    return SearchResult(evaluations=tuple(evaluations), best=best, frontier=tuple(frontier),
                        candidates=count_candidates(spec, space))


def _whole_blocks(spec: ModelSpec, tp: int, ep: int, precision: WeightPrecision) -> str | None:
    """Why engines cannot load ``precision``'s block-scaled weights sliced over tp (``check_weight_blocks``), or
    None where they can."""
    try:
        check_weight_blocks(spec, Parallelism(tp=tp, ep=ep), precision)
    except UsageError as exc:
        return str(exc)
    return None


def _executor(workers: int, tasks: int) -> tuple[Any, set[int]]:  # (ProcessPoolExecutor | None, pids)
    """Forked workers (the search's groups, the walk's simulations), or None to run in this process, with the
    children this process had before them (``_stop_workers`` spares those). An executor, not a multiprocessing.Pool:
    a worker killed from outside (the OOM killer) breaks it and fails its tasks, where a Pool loses the task for
    good and its terminate() can wait forever for the task queue's lock that an idle worker held when it died."""
    if workers <= 1 or tasks < 2:
        return None, set()
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if "fork" not in multiprocessing.get_all_start_methods():
        return None, set()
    others = _children()
    return ProcessPoolExecutor(min(workers, tasks), mp_context=multiprocessing.get_context("fork"),
                               initializer=_worker_signals), others


def _pooled(pool, run: Callable, tasks: list) -> Iterator:  # pool: concurrent.futures.ProcessPoolExecutor
    """``run(task)`` for every task in the pool's workers, each result as it finishes; the tasks of a pool broken by
    a worker killed from outside run in this process instead."""
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    futures = {pool.submit(run, task): task for task in tasks}
    for future in as_completed(futures):
        try:
            yield future.result()
        except BrokenProcessPool:
            yield run(futures[future])


def _stop_workers(pool, others: set[int]) -> None:  # pool: concurrent.futures.ProcessPoolExecutor
    """Stop the pool's forked workers now (Ctrl-C, a killed worker, work no longer needed): every child of this
    process but ``others`` (those it had before the pool)."""
    import multiprocessing

    def kill_all() -> None:
        for _ in range(10):   # the executor's own thread may be reaping some of them at the same time
            workers = [p for p in multiprocessing.active_children() if p.pid not in others]
            if not workers:
                return
            for process in workers:
                process.kill()
                process.join(1.0)

    # shutdown(wait=False) forgets the executor's own thread and result pipe: keep them
    manager = getattr(pool, "_executor_manager_thread", None)
    results = getattr(pool, "_result_queue", None)
    pool.shutdown(wait=False, cancel_futures=True)
    kill_all()
    # a worker killed while sending its result leaves the executor's thread waiting for the rest of that message, and
    # this process's own end of the pipe keeps it from ever seeing the end of it (the thread would hang the exit):
    # with every worker dead, closing that end lets it read end-of-file, find the pool broken and end
    writer = getattr(results, "_writer", None)
    if writer is not None:
        writer.close()
    # once the thread has ended nothing of the pool can still be starting or exiting (it may have reaped a worker
    # this thread was joining), and a last pass catches any worker it was handling meanwhile
    if manager is not None:
        manager.join(10.0)
    kill_all()


def _worker_signals() -> None:
    """A worker leaves Ctrl-C and SIGTERM to the parent (which stops the pool): no handler of its own that would
    print a traceback as it is terminated."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _memory(spec: ModelSpec, space: SearchSpace, engine: EngineSpec | None, gpu: GPUSpec,
            precision: WeightPrecision, kv_dtype: DType, tp: int, pp: int, ep: int, seqs: int,
            chunk: int) -> ReplicaMemory:
    return replica_memory(spec, gpu, precision, kv_dtype, tp=tp, pp=pp, ep=ep, engine=engine,
                          max_model_len=space.max_model_len, max_num_seqs=seqs, max_num_batched_tokens=chunk,
                          gpu_memory_utilization=space.gpu_memory_utilization, block_size=space.block_size,
                          redundant_experts=space.redundant_for(tp, ep),
                          kv_cache_memory_bytes=space.kv_cache_memory_bytes if takes_kv_cache_memory(engine) else None)


def step_source(spec: ModelSpec, space: SearchSpace, engine: EngineSpec | None, gpu: GPUSpec,
                precision: WeightPrecision, kv_dtype: DType, tp: int, pp: int, ep: int) -> StepSource:
    """The latency model of one replica layout (memoised: the search and its re-checks ask again)."""
    key = (spec, id(space), engine_label(engine), gpu.name, precision, kv_dtype, tp, pp, ep)
    hit = _STEPS.get(key)
    if hit is None:
        if len(_STEPS) > 4096:
            _STEPS.clear()
        hit = _STEPS[key] = latency_step(spec, gpu, precision, kv_dtype, tp=tp, pp=pp, ep=ep, engine=engine,
                                         rates=space.rates, gpus_per_node=space.gpus_per_node,
                                         routing=space.routing, block_size=space.block_size,
                                         redundant_experts=space.redundant_for(tp, ep))
    return hit


_STEPS: dict[tuple, StepSource] = {}


@dataclass(frozen=True)
class _Job:
    """One (engine, layout, formats) group of candidates: every GPU, chunk size, max_num_seqs, speculation."""

    spec: ModelSpec
    traffic: Traffic
    targets: tuple[Target, ...]
    space: SearchSpace
    overheads: Overheading
    slim: bool = False
    operating: bool = True
    _hints: dict = field(default_factory=dict, compare=False, repr=False)

    def run(self, group: tuple) -> list[Evaluation]:
        self._hints.clear()
        index, tp, pp, ep, precision, kv_dtype = group
        spec, space = self.spec, self.space
        engine = space.engines[index]
        overheads = overheads_for(self.overheads, engine)
        out: list[Evaluation] = []
        for offer in space.gpus:
            step: StepSource | None = None
            for chunk in space.chunk_sizes:
                for spec_dec in space.speculative:
                    previous: Evaluation | None = None
                    hints: tuple[int | None, int | None] = (None, None)
                    for seqs in sorted(space.max_num_seqs):
                        # where the answers likely are: this max_num_seqs at the previous chunk size, else the
                        # previous max_num_seqs at this one
                        hints = self._hints.get((offer.gpu.name, spec_dec, seqs), hints)
                        memory = _memory(spec, space, engine, offer.gpu, precision, kv_dtype, tp, pp, ep, seqs, chunk)
                        if step is None and memory.fits:   # the latency model only where something fits
                            step = step_source(spec, space, engine, offer.gpu, precision, kv_dtype, tp, pp, ep)
                        cand = Candidate(gpu=offer.gpu.name, engine=engine_label(engine), tp=tp, pp=pp, ep=ep,
                                         weights=precision.label, kv_dtype=kv_dtype.name, max_num_seqs=seqs,
                                         chunk=chunk, spec=spec_dec,
                                         redundant_experts=space.redundant_for(tp, ep))
                        previous = _evaluate(cand, offer, memory, step, self.traffic, self.targets, space,
                                             overheads, spec_dec, previous, hints, self.operating,
                                             policy=scheduler_policy(engine))
                        out.append(previous)
                        if previous.capacity is not None:
                            hints = (capacity_index(previous.capacity) or hints[0],
                                     capacity_index(previous.frontier_capacity) or hints[1]
                                     if previous.frontier_capacity is not None else hints[1])
                            self._hints[(offer.gpu.name, spec_dec, seqs)] = hints
        if self.slim:
            return [slim(e) for e in out]
        return out


def _replica(step, memory: ReplicaMemory, traffic: Traffic, seqs: int, chunk: int, overheads: Overheads,
             spec_dec: SpecDecoding | None, policy: SchedulerPolicy, lockstep_ranks: int = 1) -> ReplicaServing:
    if memory.max_running is not None:   # the engine's own cap (SGLang's state slots) binds below max_num_seqs
        seqs = max(1, min(seqs, memory.max_running))
    return ReplicaServing(step=step, input_len=traffic.input_len, output_len=traffic.output_len, max_num_seqs=seqs,
                          max_num_batched_tokens=chunk, kv_capacity_tokens=memory.kv_capacity_tokens,
                          block_size=memory.block_size, overheads=overheads,
                          prefix_hit_ratio=traffic.prefix_hit_ratio, spec=spec_dec,
                          policy=policy, lockstep_ranks=lockstep_ranks)


def replicas_needed(capacity: Capacity, traffic: Traffic, group: int = 1) -> tuple[int, float]:
    """Replicas needed, a multiple of ``group`` (a data-parallel deployment's ranks), and the per-replica capacity
    in the traffic's unit (req/s or concurrent requests)."""
    if traffic.rate_per_s is not None:
        per = capacity.rate_per_s
    else:
        per = capacity.rate_per_s * (capacity.point.e2e(0) + capacity.point.model.overheads.stream_s)
        per = math.floor(per + 1e-9)
    if per <= 0:
        return 0, 0.0
    replicas = max(1, math.ceil(traffic.load / per - 1e-9))
    return _whole_groups(replicas, group), per


def _seats_idle(capacity: Capacity, seats: float) -> bool:
    """True when ``seats`` (a replica's min(max_num_seqs, KV-limited sequences)) play no part in this capacity: it
    stopped at a latency target, and at 1 % more load than its own the seats are far from full -- c - a > 5 sqrt(c) +
    2, where Erlang's P(wait) is below 3e-7 and ``serving.erlang`` returns exactly 0 -- so every point the search
    looked at is the same whatever the seats."""
    if capacity.binding in ("max_num_seqs", "KV cache", "token budget"):
        return False
    return seats - 1.01 * capacity.point.seat_load > HALFIN_WHITT * math.sqrt(seats) + 2


def _evaluate(cand: Candidate, offer: GpuOffer, memory: ReplicaMemory, step, traffic: Traffic,
              targets: tuple[Target, ...], space: SearchSpace, overheads: Overheads,
              spec_dec: SpecDecoding | None, previous: Evaluation | None = None,
              hints: tuple[int | None, int | None] = (None, None), with_operating: bool = True, *,
              policy: SchedulerPolicy) -> Evaluation:
    """Size one candidate; ``previous`` (the same configuration with fewer max_num_seqs) is reused where the
    seats did not matter to it; ``hints``: where a similar configuration's capacities were (search starts);
    ``with_operating``: also the operating point at the traffic's share per replica (its latencies, the cost per
    token) -- ranking needs only the capacity, so a search can leave it to the configurations it shows."""
    price = offer.price_per_hour
    if not memory.fits or memory.kv_capacity_tokens <= 0:
        why = "does not fit: " + memory.reason if not memory.fits else "no room for KV cache"
        return Evaluation(candidate=cand, fits=False, feasible=False, reason=why, price_per_gpu_hour=price,
                          memory=memory)
    if cand.max_num_seqs > memory.kv_capacity_tokens:
        return Evaluation(candidate=cand, fits=True, feasible=False, price_per_gpu_hour=price, memory=memory,
                          reason=f"max_num_seqs {cand.max_num_seqs} exceeds the {memory.kv_capacity_tokens:,} KV "
                                 "tokens")
    model = _replica(step, memory, traffic, cand.max_num_seqs, cand.chunk, overheads, spec_dec, policy, cand.dp)
    prior = previous if previous is not None and previous.model is not None else None
    if prior is not None and with_operating and prior.operating is None:
        prior = None
    relaxed = _targets_without_tpot(targets)
    seats = load_limit(model)
    before = load_limit(prior.model) if prior is not None and prior.model is not None else 0.0
    reuse_cap = prior is not None and prior.capacity is not None and \
        _seats_idle(prior.capacity, before) and _seats_idle(prior.capacity, seats)
    reuse_front = prior is not None and prior.frontier_capacity is not None and \
        _seats_idle(prior.frontier_capacity, before) and _seats_idle(prior.frontier_capacity, seats)
    operating = None
    if reuse_cap and reuse_front:
        assert prior is not None and prior.capacity is not None and prior.frontier_capacity is not None
        cap, frontier_cap, operating = prior.capacity, prior.frontier_capacity, prior.operating
    elif reuse_cap:
        assert prior is not None and prior.capacity is not None
        frontier_cap = max_rates(model, targets, relaxed, known=prior.capacity, hints=hints)[1]
        cap, operating = prior.capacity, prior.operating
    else:
        cap, frontier_cap = max_rates(model, targets, relaxed, hints=hints)
    frontier = frontier_cap.point if frontier_cap.rate_per_s > 0 else None
    numbers: dict[str, float] = {}
    if frontier is not None:
        if prior is not None and frontier_cap is prior.frontier_capacity:
            numbers.update(tokens_per_gpu=prior.numbers["tokens_per_gpu"],
                           tokens_per_user=prior.numbers["tokens_per_user"])
        else:
            numbers.update(tokens_per_gpu=frontier.rate_per_s * traffic.output_len.mean / cand.gpus_per_replica,
                           tokens_per_user=tokens_per_user(frontier))
    concurrency = cap.rate_per_s * (cap.point.e2e(0) + overheads.stream_s) if cap.rate_per_s > 0 else 0.0
    replicas, _ = replicas_needed(cap, traffic, cand.dp)
    stored = Capacity(rate_per_s=cap.rate_per_s, point=cap.point, binding=cap.binding)
    if replicas == 0:
        return Evaluation(candidate=cand, fits=True, feasible=False, price_per_gpu_hour=price, memory=memory,
                          reason=f"{cap.binding} missed even for a lone request", binding=cap.binding,
                          frontier=frontier, model=model, capacity=stored, frontier_capacity=frontier_cap,
                          numbers=numbers)
    gpus = replicas * cand.gpus_per_replica
    cost = gpus * price
    feasible = gpus <= space.max_gpus
    reason = cap.binding if feasible else f"needs {gpus} GPUs, more than the limit of {space.max_gpus}"
    if not with_operating:
        return Evaluation(candidate=cand, fits=True, feasible=feasible, reason=reason, price_per_gpu_hour=price,
                          memory=memory, capacity_rate_per_s=cap.rate_per_s, capacity_concurrency=concurrency,
                          binding=cap.binding, replicas=replicas, num_gpus=gpus, cost_per_hour=cost,
                          frontier=frontier, cost_per_m_input=math.nan, cost_per_m_output=math.nan, model=model,
                          capacity=stored, frontier_capacity=frontier_cap, numbers=numbers)
    base = Evaluation(candidate=cand, fits=True, feasible=feasible, reason=reason, price_per_gpu_hour=price,
                      memory=memory, capacity_rate_per_s=cap.rate_per_s, capacity_concurrency=concurrency,
                      binding=cap.binding, replicas=replicas, num_gpus=gpus, cost_per_hour=cost, frontier=frontier,
                      model=model, capacity=stored, frontier_capacity=frontier_cap, numbers=numbers)
    reuse = operating if prior is not None and prior.replicas == replicas else None
    return operate(base, traffic, targets, reuse, prior.numbers if reuse is not None and prior is not None else None)


def operate(e: Evaluation, traffic: Traffic, targets: tuple[Target, ...], known: Point | None = None,
            known_numbers: dict[str, float] | None = None) -> Evaluation:
    """``e`` (with its model and capacity) at its operating point: one replica's share of the traffic, its
    latencies and the cost per million input and output tokens. ``known``: that point already (with its numbers)."""
    model, cap = e.model, e.capacity
    assert model is not None and cap is not None and e.replicas
    per_replica = traffic.load / e.replicas
    operating = known
    if operating is None:
        operating = at_rate(model, per_replica, below=cap.point, known=cap.explored) \
            if traffic.rate_per_s is not None else at_concurrency(model, per_replica)
    numbers = dict(e.numbers)
    if known is not None and known_numbers is not None:
        numbers.update({k: v for k, v in known_numbers.items() if k not in ("tokens_per_gpu", "tokens_per_user")})
    else:
        numbers.update({t.key: operating.metric(t) for t in targets})
        numbers.update(op_rate=operating.rate_per_s, op_batch=operating.batch, op_stable=float(operating.stable))
    cin, cout = _cost_split(operating, e.cost_per_hour, operating.rate_per_s * e.replicas, traffic.input_len.mean,
                            traffic.output_len.mean)
    return replace(e, operating=operating, cost_per_m_input=cin, cost_per_m_output=cout, numbers=numbers)


def tokens_per_gpu(e: Evaluation, point: Point | None = None) -> float:
    """Output tokens/s per GPU at ``point`` (the frontier point by default)."""
    p = point or e.frontier
    if p is None:
        return 0.0
    return p.rate_per_s * p.model.output_len.mean / e.candidate.gpus_per_replica


def tokens_per_user(point: Point | None) -> float:
    """Output tokens/s one user sees while decoding: 1 / mean TPOT."""
    return 1 / point.tpot(0) if point is not None else 0.0


def pareto_frontier(evaluations: list[Evaluation]) -> list[Evaluation]:
    """Configurations no other beats on both tokens/s per GPU and tokens/s per user, by tokens/s per user."""
    points = sorted(((e.numbers["tokens_per_user"], e.numbers["tokens_per_gpu"], e) for e in evaluations),
                    key=lambda x: (-x[0], -x[1], x[2].candidate.label))
    front: list[Evaluation] = []
    best_gpu = -1.0
    for _, per_gpu, e in points:
        if per_gpu > best_gpu:
            front.append(e)
            best_gpu = per_gpu
    return front


def searched_engine(space: SearchSpace, label: str) -> EngineSpec | None:
    """The engine of ``space`` a candidate names by its label (None for the ideal arithmetic)."""
    return next(e for e in space.engines if engine_label(e) == label)


def full_evaluation(spec: ModelSpec, traffic: Traffic, targets: tuple[Target, ...], space: SearchSpace,
                    overheads: Overheading, e: Evaluation) -> Evaluation:
    """``e`` with its model objects and its operating point (re-evaluated if a worker sent back numbers only, or
    the search left the operating point out)."""
    if not e.fits or e.candidate.mode != "aggregated":
        return e
    if e.model is not None:
        return operate(e, traffic, targets) if e.operating is None and e.replicas else e
    c = e.candidate
    offer = space.offer(c.gpu)
    precision = next(p for p in space.weight_precisions if p.label == c.weights)
    kv_dtype = next(k for k in space.kv_dtypes if k.name == c.kv_dtype)
    engine = searched_engine(space, c.engine)
    step = step_source(spec, space, engine, offer.gpu, precision, kv_dtype, c.tp, c.pp, c.ep)
    assert e.memory is not None
    return _evaluate(c, offer, e.memory, step, traffic, targets, space, overheads_for(overheads, engine), c.spec,
                     policy=scheduler_policy(engine))


# --- disaggregated prefill / decode ---------------------------------------------------------------------


def prefill_capacity(model: ReplicaServing, targets: tuple[Target, ...]) -> Capacity:
    """Max rate of the replica serving prefill only (disaggregated), within the TTFT targets."""
    return prefill_only_max_rate(model, targets)


def _disaggregated(spec: ModelSpec, traffic: Traffic, targets: tuple[Target, ...], space: SearchSpace,
                   overheads: Overheading, aggregated: list[Evaluation]) -> list[Evaluation]:
    """Per GPU type and formats: the best prefill layout (TTFT) and the best decode layout (TPOT, e2e), each
    sized to the traffic; the prompt's KV reaches the decode pool over the interconnect."""
    out: list[Evaluation] = []
    if traffic.rate_per_s is None:
        return out
    by_group: dict[tuple, list[Evaluation]] = {}
    for e in aggregated:
        if e.fits and e.model is None and e.capacity_rate_per_s > 0:
            e = full_evaluation(spec, traffic, targets, space, overheads, e)
        if e.fits and e.model is not None:   # a pool of data-parallel ranks comes in whole groups, as aggregated
            c = e.candidate
            by_group.setdefault((c.engine, c.gpu, c.weights, c.kv_dtype, c.spec), []).append(e)
    decode_targets = tuple(t for t in targets if t.metric in ("tpot", "itl"))
    for group in by_group.values():
        price = group[0].price_per_gpu_hour
        best_prefill: tuple[float, Evaluation, float] | None = None
        for e in group:
            assert e.model is not None
            rate = prefill_capacity(e.model, targets).rate_per_s
            if rate <= 0:
                continue
            per_gpu = rate / e.candidate.gpus_per_replica
            if best_prefill is None or per_gpu > best_prefill[0]:
                best_prefill = (per_gpu, e, rate)
        if best_prefill is None:
            continue
        _, pre, pre_rate = best_prefill
        pre_replicas = _whole_groups(max(1, math.ceil(traffic.load / pre_rate - 1e-9)), pre.candidate.dp)
        for e in group:
            assert e.model is not None and e.memory is not None
            kv_bytes = e.memory.kv_bytes_per_token_per_gpu * e.candidate.tp * traffic.input_len.mean
            transfer = kv_bytes / space.kv_transfer_bytes_per_s
            dec_model = replace(e.model, role="decode", kv_transfer_s=transfer)
            cap = max_rate(dec_model, decode_targets) if decode_targets else max_rate(dec_model, ())
            if cap.rate_per_s <= 0:
                continue
            replicas = _whole_groups(max(1, math.ceil(traffic.load / cap.rate_per_s - 1e-9)), e.candidate.dp)
            gpus = replicas * e.candidate.gpus_per_replica + pre_replicas * pre.candidate.gpus_per_replica
            cost = gpus * price
            operating = at_rate(dec_model, traffic.load / replicas)
            pre_point = prefill_only_at(pre.model, traffic.load / pre_replicas)  # type: ignore[arg-type]
            # a request's TTFT is the prefill pool's plus the decode side's (KV transfer, its wait, the first
            # step): percentiles added, an upper bound, as the e2e targets are checked
            whole = {t.key: pre_point.ttft(t.percentile) + operating.metric(t)
                     for t in targets if t.metric in ("ttft", "e2e")}
            late = [t for t in targets if t.key in whole and whole[t.key] > t.seconds]
            cand = replace(e.candidate, mode="disaggregated", prefill_tp=pre.candidate.tp,
                           prefill_replicas=pre_replicas, prefill_ep=pre.candidate.ep)
            feasible = gpus <= space.max_gpus and not late
            reason = (cap.binding if feasible else f"{late[0].label} above target" if late else
                      f"needs {gpus} GPUs, more than the limit of {space.max_gpus}")
            out_rate = traffic.load
            per_s = cost / 3600
            pre_gpus = pre_replicas * pre.candidate.gpus_per_replica
            cin = per_s * pre_gpus / gpus / (out_rate * traffic.input_len.mean) * 1e6
            cout = per_s * (gpus - pre_gpus) / gpus / (out_rate * traffic.output_len.mean) * 1e6
            ev = _with_numbers(Evaluation(
                candidate=cand, fits=True, feasible=feasible, reason=reason,
                price_per_gpu_hour=price, memory=e.memory, capacity_rate_per_s=cap.rate_per_s, binding=cap.binding,
                replicas=replicas, num_gpus=gpus, cost_per_hour=cost, operating=operating, frontier=None,
                cost_per_m_input=cin, cost_per_m_output=cout, model=dec_model, prefill=pre), targets)
            out.append(replace(ev, numbers={**ev.numbers, **whole}))
    return out


def _whole_groups(replicas: int, group: int) -> int:
    """``replicas`` rounded up to whole groups of ``group`` data-parallel ranks."""
    return -(-replicas // group) * group


def speculative_break_even(model: ReplicaServing, without: ReplicaServing, limit: int = 1024) -> int | None:
    """Smallest decode batch at which speculative decoding no longer lowers the time per output token
    (decode-only steps: verification of k + 1 tokens per sequence plus k draft passes, over the tokens
    accepted per step, against one plain decode step)."""
    from tfcalc.calc.serving import _work

    w_spec, w_plain = _work(model), _work(without)
    for batch in range(1, limit + 1):
        if w_spec.step(float(batch), 0.0, 0.0) / w_spec.accepted >= w_plain.step(float(batch), 0.0, 0.0):
            return batch
    return None


def simulate_evaluation(e: Evaluation, traffic: Traffic, num_requests: int = 2000, seed: int = 0):  # -> SimResult
    """Run one replica of ``e`` through the discrete-event scheduler simulation at its share of the traffic
    (Poisson arrivals, or a closed loop at its share of the concurrency); a data-parallel plan's group of ranks in
    lockstep, ``num_requests`` over the group; None for disaggregated plans."""
    from tfcalc.calc.serving_sim import SimConfig, Workload, simulate

    model = e.model
    if model is None or e.replicas == 0 or e.candidate.mode != "aggregated":
        return None
    ranks = e.candidate.dp
    cfg = SimConfig(max_num_seqs=model.max_num_seqs, max_num_batched_tokens=model.max_num_batched_tokens,
                    kv_capacity_tokens=int(model.kv_capacity_tokens), block_size=model.block_size,
                    overheads=model.overheads, spec=model.spec, policy=model.policy)
    if traffic.rate_per_s is not None:
        load = Workload(input_len=traffic.input_len, output_len=traffic.output_len,
                        num_requests=num_requests, rate_per_s=traffic.rate_per_s / e.replicas * ranks,
                        prefix_hit_ratio=traffic.prefix_hit_ratio, seed=seed, warmup_fraction=0.1)
    else:
        concurrency = max(1, round((traffic.concurrency or 1) / e.replicas)) * ranks
        load = Workload(input_len=traffic.input_len, output_len=traffic.output_len, num_requests=num_requests,
                        concurrency=concurrency, prefix_hit_ratio=traffic.prefix_hit_ratio, seed=seed,
                        warmup_fraction=0.1)
    return simulate(model.step, cfg, load, ranks=ranks)


def resize(e: Evaluation, replicas: int, traffic: Traffic, targets: tuple[Target, ...],
           space: SearchSpace) -> Evaluation:
    """``e`` (with its model) served by ``replicas`` replicas: GPUs, cost, feasibility and the operating point."""
    gpus = replicas * e.candidate.gpus_per_replica
    feasible = gpus <= space.max_gpus
    sized = replace(e, replicas=replicas, num_gpus=gpus, cost_per_hour=gpus * e.price_per_gpu_hour, feasible=feasible,
                    reason=e.binding if feasible else f"needs {gpus} GPUs, more than the limit of {space.max_gpus}",
                    operating=None)
    return operate(sized, traffic, targets)


@dataclass(frozen=True, kw_only=True)
class Verified:
    """The plan the simulation confirmed (or the model's, when none was), one line per simulation, and the confirmed
    plan's simulated value of each target (``Target.key`` -> seconds; empty when none was confirmed)."""

    plan: Evaluation | None
    verified: bool
    lines: tuple[str, ...]
    simulations: int
    simulated: dict[str, float] = field(default_factory=dict)


_WALK: tuple | None = None   # verified_choice's context, inherited by its forked simulation workers


def _simulate_at(job: tuple[int, int]):  # -> SimResult
    """A simulation worker: configuration ``index`` of the walk's search result at ``replicas`` replicas. Anything
    raised comes back to the walk as an Exception (a BaseException would end the worker and lose the task)."""
    assert _WALK is not None
    result, traffic, targets, space, full, num_requests = _WALK
    index, replicas = job
    try:
        rich = full(result.evaluations[index])
        plan = rich if replicas == rich.replicas else resize(rich, replicas, traffic, targets, space)
        return simulate_evaluation(plan, traffic, num_requests=num_requests)
    except Exception:
        raise
    except BaseException as exc:   # noqa: BLE001 - handed to the walk, which re-raises it
        raise RuntimeError(f"simulation worker stopped: {exc!r}") from None


class _Simulations:
    """The walk's simulations, each run once: in this process, or with ``workers`` > 1 in forked workers that run
    ahead on the simulations the walk may need next (this configuration with one more replica, the next cheaper
    configurations at the replicas the model asks for). The simulation is deterministic, so the walk's answer does
    not depend on which process ran it; simulations it never asks for are dropped with the pool."""

    def __init__(self, result: SearchResult, traffic: Traffic, targets: tuple[Target, ...], space: SearchSpace,
                 full: Callable[[Evaluation], Evaluation], num_requests: int, workers: int) -> None:
        global _WALK
        self.result, self.traffic, self.targets, self.space = result, traffic, targets, space
        self.full, self.num_requests, self.workers = full, num_requests, workers
        self.rich: dict[int, Evaluation] = {}
        self.pending: dict[tuple[int, int], tuple[Any, float]] = {}   # (config, replicas) -> (job, cost)
        _WALK = (result, traffic, targets, space, full, num_requests)
        self.pool, self.others = _executor(workers, len(result.evaluations))

    def evaluation(self, index: int) -> Evaluation:
        if index not in self.rich:
            self.rich[index] = self.full(self.result.evaluations[index])
        return self.rich[index]

    def run(self, index: int, plan: Evaluation, best_cost: float):  # -> SimResult
        """The simulation of ``plan`` (configuration ``index``): a worker's, or this process's where there is no
        pool or a worker was killed (its task would never be answered; the rest of the walk runs here)."""
        if self.pool is None:
            return simulate_evaluation(plan, self.traffic, num_requests=self.num_requests)
        key = (index, plan.replicas)
        ahead = self.pending.pop(key, None)
        job = ahead[0] if ahead is not None else self.pool.submit(_simulate_at, key)
        self._run_ahead(index, plan, best_cost)
        from concurrent.futures.process import BrokenProcessPool

        try:
            return job.result()
        except BrokenProcessPool:   # a worker was killed: the executor fails every task it had
            self._stop_pool()
            return simulate_evaluation(plan, self.traffic, num_requests=self.num_requests)

    def _run_ahead(self, index: int, plan: Evaluation, best_cost: float) -> None:
        """Keep the workers busy with the walk's likely next simulations, cheaper than the best confirmed plan;
        forget those the walk has gone past (a worker finishes one it started; its result is not read)."""
        for key, (_, cost) in list(self.pending.items()):
            if key[0] < index or (key[0] == index and key[1] <= plan.replicas) or cost >= best_cost:
                del self.pending[key]
        budget = self.workers - 1 - len(self.pending)
        if budget <= 0:
            return
        nxt = resize(self.evaluation(index), plan.replicas + plan.candidate.dp, self.traffic, self.targets,
                     self.space)
        ahead = [(index, nxt)] if nxt.feasible and nxt.cost_per_hour < best_cost else []
        evaluations = self.result.evaluations
        j = index + 1
        while len(ahead) < budget and j < len(evaluations):
            e = evaluations[j]
            if not e.feasible or e.cost_per_hour >= best_cost:
                break
            if e.candidate.mode == "aggregated":
                ahead.append((j, self.evaluation(j)))
            j += 1
        for i, later in ahead[:budget]:
            key = (i, later.replicas)
            if key not in self.pending:
                self.pending[key] = (self.pool.submit(_simulate_at, key), later.cost_per_hour)

    def _stop_pool(self) -> None:
        """Stop the workers now: simulations run ahead that the walk did not need are dropped."""
        if self.pool is not None:
            _stop_workers(self.pool, self.others)
            self.pool, self.pending = None, {}

    def close(self) -> None:
        global _WALK
        self._stop_pool()
        _WALK = None


def _children() -> set[int]:
    """Process ids of this process's live children (a pool's workers)."""
    import multiprocessing

    return {p.pid for p in multiprocessing.active_children() if p.pid is not None}


def verified_choice(result: SearchResult, traffic: Traffic, targets: tuple[Target, ...], space: SearchSpace,
                    full: Callable[[Evaluation], Evaluation], num_requests: int = 2000,
                    max_simulations: int = 12, workers: int = 1,
                    progress: Callable[[int, Evaluation], None] | None = None) -> Verified:
    """The cheapest plan whose simulated replica meets every target: configurations in the model's cost order, each
    at the replicas the model asks for and, when the simulation misses a target, one more replica at a time; a
    configuration's cost in the model is a lower bound on its verified cost, so the walk stops once it reaches the
    best verified cost: the answer is the cheapest verified plan of all (within ``max_simulations``).

    Because each configuration's verified replicas are the fewest from the model's count up that the (deterministic)
    simulation accepts, looser targets never raise any configuration's verified cost (the model's count only falls
    and the same simulations meet looser targets), and a lower price lowers costs without changing a verdict: so
    looser targets never cost more and a cheaper price never turns a verified plan into a failure or a dearer one
    -- exactly, as long as the walk ends within ``max_simulations``. More traffic needs more replicas in the model,
    but a simulation at a lower load is not proven to meet targets it meets at a higher one, so that property is the
    model's (docs/capacity.md, "Monotonicity"). ``workers`` > 1 runs simulations ahead in forked processes
    (``_Simulations``): the same answer, sooner. ``progress`` hears each simulation's number and plan as it starts.
    """
    sims = _Simulations(result, traffic, targets, space, full, num_requests, workers)
    try:
        return _walk(result, traffic, targets, space, sims, max_simulations, progress)
    finally:
        sims.close()


def _walk(result: SearchResult, traffic: Traffic, targets: tuple[Target, ...], space: SearchSpace,
          sims: _Simulations, max_simulations: int,
          progress: Callable[[int, Evaluation], None] | None = None) -> Verified:
    """verified_choice's walk (its docstring), its simulations from ``sims``."""
    num_requests = sims.num_requests
    best: Evaluation | None = None
    best_cost = math.inf
    best_values: dict[str, float] = {}
    lines: list[str] = []
    misses: list[str] = []
    runs = 0
    capped = False
    for index, e in enumerate(result.evaluations):
        if not e.feasible or e.cost_per_hour >= best_cost:
            break
        if e.candidate.mode != "aggregated":
            if best is None:
                return Verified(plan=e, verified=False, lines=("simulation: not run for disaggregated plans",),
                                simulations=runs)
            continue
        rich = sims.evaluation(index)
        replicas = rich.replicas
        while True:
            if runs >= max_simulations:
                capped = True
                break
            plan = rich if replicas == rich.replicas else resize(rich, replicas, traffic, targets, space)
            if not plan.feasible or plan.cost_per_hour >= best_cost:
                break
            if progress:
                progress(runs + 1, plan)
            sim = sims.run(index, plan, best_cost)
            runs += 1
            assert sim is not None
            measured = ", ".join(f"{t.label} {sim.metric(t.metric, t.percentile) * 1e3:,.1f} ms" for t in targets)
            ok = all(sim.metric(t.metric, t.percentile) <= t.seconds for t in targets)
            dp = e.candidate.dp
            unit = (f"one of {replicas // dp} group(s) of {dp} data-parallel ranks in lockstep" if dp > 1 else
                    f"one of {replicas} replica(s)")
            line = (f"simulation of {unit} ({num_requests:,} requests, {sim.steps:,} "
                    f"{'rank steps' if dp > 1 else 'steps'}, {sim.preemptions} preemptions) of {e.candidate.label}: "
                    f"{measured} -> {'meets the targets' if ok else 'misses a target'}")
            if ok:
                best, best_cost = plan, plan.cost_per_hour
                best_values = {t.key: sim.metric(t.metric, t.percentile) for t in targets}
                lines.append(line)
                break
            misses.append(line)
            replicas += e.candidate.dp
        if capped:
            break
    if misses:   # the first miss in full, then how many more
        lines.insert(0, misses[0])
        if len(misses) > 1:
            lines.insert(1, f"simulation: {len(misses) - 1} more cheaper plan(s) missed a target in simulation")
    if capped:
        lines.append(f"simulation: stopped after {max_simulations} simulations" +
                     ("; the cheapest plan confirmed so far is shown" if best is not None else ""))
    if best is None:
        lines.append("simulation: no plan tried met every target in simulation; the model's choice is shown")
        return Verified(plan=result.best, verified=False, lines=tuple(lines), simulations=runs)
    return Verified(plan=best, verified=True, lines=tuple(lines), simulations=runs, simulated=best_values)
