"""EngineSpec: how one serving engine (vLLM, SGLang, TensorRT-LLM) budgets GPU memory, as frozen data.

Presets live in ``presets/engines/NAME-VERSION.yaml`` (loaded by ``tfcalc.spec.presets.load_engine``); each names
the releases it describes and cites the engine source for every mechanism. The formulas that use these numbers
are in ``tfcalc.calc.engine``. Sizes in the YAML are in GiB (2^30 bytes) or MiB and converted to bytes here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tfcalc.errors import SpecError

GIB = 1 << 30
MIB = 1 << 20
BudgetKind = Literal["utilization", "static_fraction", "free_fraction"]
CaptureRule = Literal["vllm", "vllm-0.8", "sglang", "none"]
ConcurrencyRule = Literal["vllm", "pool"]

# Names of the budget terms, each engine's own word for it in its log (for --explain).
TERM_KEYS = ("capacity", "requested", "weights", "activation", "non_torch", "cuda_graph", "kv_budget", "kv_tokens",
             "concurrency")


@dataclass(frozen=True, kw_only=True)
class SchedulerDefault:
    """Defaults for max_num_seqs / max_num_batched_tokens on GPUs of at least ``min_memory_gib`` whose name holds
    none of ``exclude_gpus``; the first matching row wins."""

    max_num_seqs: int
    max_num_batched_tokens: int
    min_memory_gib: float = 0.0
    exclude_gpus: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Overheads:
    """Memory outside the torch allocator, per GPU. ``startup_*``: CUDA context (and NCCL communicators at tp > 1)
    present before the engine's baseline; counted in the budget only if ``startup_in_budget``. ``non_torch_*``: what
    appears during the profiling run (NCCL / custom all-reduce buffers, cuBLAS workspaces), always counted."""

    startup_bytes_tp1: int
    startup_bytes_tp: int
    startup_in_budget: bool
    non_torch_bytes_tp1: int
    non_torch_bytes_tp: int
    non_torch_bytes_pp: int


@dataclass(frozen=True, kw_only=True)
class ActivationModel:
    """The profiling run's torch peak: a forward of max_num_batched_tokens tokens, then (last pipeline stage) a
    dummy sampler pass over min(max_num_seqs, max_num_batched_tokens) rows of logits."""

    sampler_bytes_per_logit: float
    sampler_scratch_rows: int
    hidden_copies: int
    moe_workspace: bool


@dataclass(frozen=True, kw_only=True)
class CudaGraphModel:
    capture: CaptureRule
    first_capture_bytes: int
    per_size_bytes: int
    per_size_bytes_tp: int      # at tp > 1 (custom all-reduce buffers registered per graph)
    in_budget: bool


@dataclass(frozen=True, kw_only=True)
class KVLayout:
    hybrid_groups: bool
    sliding_chunk: bool
    swa_full_tokens_ratio: float | None
    concurrency: ConcurrencyRule


@dataclass(frozen=True, kw_only=True)
class WeightLayout:
    vocab_padding: int
    rotary_cache: bool
    mla_absorbed_copy: bool
    mxfp4_pad_hidden: int
    mxfp4_pad_intermediate: int


@dataclass(frozen=True, kw_only=True)
class StaticFractionRule:
    """SGLang's automatic mem_fraction_static: (capacity - reserved) / capacity, reserved in MiB =
    base + max(chunked_prefill, 2048) x per_prefill_token + cuda_graph_max_bs x per_graph_bs + tp x pp / 8 x 1024,
    at least ``floor_mib`` on GPUs above 60 GiB. ``tiers``: (memory below GiB, chunked_prefill, max bs tp < 4,
    max bs tp >= 4)."""

    base_mib: float
    per_prefill_token_mib: float
    per_graph_bs_mib: float
    floor_mib: float
    tiers: tuple[tuple[float, int, int, int], ...]


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """One engine version's memory accounting (see the module docstring)."""

    name: str
    version: str
    releases: str
    display_name: str
    budget: BudgetKind
    memory_fraction: float | None
    block_size: int
    scheduler_defaults: tuple[SchedulerDefault, ...]
    overheads: Overheads
    activation: ActivationModel
    cuda_graphs: CudaGraphModel
    kv: KVLayout
    weights: WeightLayout
    static_fraction_rule: StaticFractionRule | None = None
    default: bool = False
    terms: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def label(self) -> str:
        return f"{self.name} {self.releases}"


def _require(condition: bool, origin: str, message: str) -> None:
    if not condition:
        raise SpecError(f"{origin}: {message}")


def _section(data: dict[str, Any], key: str, required: set[str], origin: str,
             optional: frozenset[str] = frozenset()) -> dict[str, Any]:
    from tfcalc.spec.presets import suggest

    value = data.get(key)
    _require(isinstance(value, dict), origin, f"field '{key}' must be a mapping")
    allowed = required | optional
    unknown = sorted(set(value) - allowed)
    if unknown:
        hints = suggest(unknown[0], sorted(allowed), limit=1)
        hint = f" (did you mean '{key}.{hints[0]}'?)" if hints else ""
        raise SpecError(f"{origin}: unknown field '{key}.{unknown[0]}'{hint}")
    missing = sorted(k for k in required if k not in value)
    _require(not missing, origin, f"missing required field '{key}.{missing[0]}'" if missing else "")
    return value


def _num(value: Any, origin: str, key: str, low: float = 0.0, high: float | None = None) -> float:
    _require(isinstance(value, (int, float)) and not isinstance(value, bool), origin,
             f"field '{key}' must be a number, got {value!r}")
    _require(value >= low and (high is None or value <= high), origin,
             f"field '{key}' must be in [{low}, {high if high is not None else 'inf'}], got {value!r}")
    return float(value)


def _int(value: Any, origin: str, key: str, low: int = 0) -> int:
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= low, origin,
             f"field '{key}' must be an integer >= {low}, got {value!r}")
    return int(value)


def _bool(value: Any, origin: str, key: str) -> bool:
    _require(isinstance(value, bool), origin, f"field '{key}' must be true or false, got {value!r}")
    return bool(value)


def _gib(value: Any, origin: str, key: str) -> int:
    return round(_num(value, origin, key) * GIB)


def _mib(value: Any, origin: str, key: str) -> int:
    return round(_num(value, origin, key) * MIB)


_TOP = {"name", "version", "releases", "display_name", "default", "budget", "memory_fraction", "block_size",
        "scheduler_defaults", "overheads", "activation", "cuda_graphs", "kv", "weights", "static_fraction_rule",
        "terms", "sources"}


def engine_from_mapping(data: dict[str, Any], origin: str, default_name: str) -> EngineSpec:
    """Validate an engine preset mapping (see presets/engines/*.yaml) and build the EngineSpec."""
    from tfcalc.spec.presets import suggest

    unknown = sorted(set(data) - _TOP)
    if unknown:
        hints = suggest(unknown[0], sorted(_TOP), limit=1)
        raise SpecError(f"{origin}: unknown field '{unknown[0]}'" + (f" (did you mean '{hints[0]}'?)" if hints else ""))
    for key in ("name", "version", "releases", "budget", "block_size", "scheduler_defaults"):
        _require(key in data, origin, f"missing required field '{key}'")
    budget = data["budget"]
    _require(budget in ("utilization", "static_fraction", "free_fraction"), origin,
             f"field 'budget' must be utilization, static_fraction or free_fraction, got {budget!r}")
    fraction = data.get("memory_fraction")
    if fraction is not None:
        fraction = _num(fraction, origin, "memory_fraction", 0.0, 1.0)
        _require(fraction > 0, origin, "field 'memory_fraction' must be positive")
    rows = data["scheduler_defaults"]
    _require(isinstance(rows, list) and rows, origin, "field 'scheduler_defaults' must be a non-empty list")
    defaults = []
    for row in rows:
        _require(isinstance(row, dict), origin, "each scheduler_defaults row must be a mapping")
        extra = sorted(set(row) - {"max_num_seqs", "max_num_batched_tokens", "min_memory_gib", "exclude_gpus"})
        _require(not extra, origin, f"unknown field 'scheduler_defaults.{extra[0] if extra else ''}'")
        defaults.append(SchedulerDefault(
            max_num_seqs=_int(row.get("max_num_seqs"), origin, "scheduler_defaults.max_num_seqs", 1),
            max_num_batched_tokens=_int(row.get("max_num_batched_tokens"), origin,
                                        "scheduler_defaults.max_num_batched_tokens", 1),
            min_memory_gib=_num(row.get("min_memory_gib", 0), origin, "scheduler_defaults.min_memory_gib"),
            exclude_gpus=tuple(str(g) for g in row.get("exclude_gpus", []))))
    o = _section(data, "overheads", {"startup_gib_tp1", "startup_gib_tp", "startup_in_budget", "non_torch_gib_tp1",
                                     "non_torch_gib_tp", "non_torch_gib_pp"}, origin)
    overheads = Overheads(
        startup_bytes_tp1=_gib(o["startup_gib_tp1"], origin, "overheads.startup_gib_tp1"),
        startup_bytes_tp=_gib(o["startup_gib_tp"], origin, "overheads.startup_gib_tp"),
        startup_in_budget=_bool(o["startup_in_budget"], origin, "overheads.startup_in_budget"),
        non_torch_bytes_tp1=_gib(o["non_torch_gib_tp1"], origin, "overheads.non_torch_gib_tp1"),
        non_torch_bytes_tp=_gib(o["non_torch_gib_tp"], origin, "overheads.non_torch_gib_tp"),
        non_torch_bytes_pp=_gib(o["non_torch_gib_pp"], origin, "overheads.non_torch_gib_pp"))
    a = _section(data, "activation", {"sampler_bytes_per_logit", "sampler_scratch_rows", "hidden_copies",
                                      "moe_workspace"}, origin)
    activation = ActivationModel(
        sampler_bytes_per_logit=_num(a["sampler_bytes_per_logit"], origin, "activation.sampler_bytes_per_logit"),
        sampler_scratch_rows=_int(a["sampler_scratch_rows"], origin, "activation.sampler_scratch_rows"),
        hidden_copies=_int(a["hidden_copies"], origin, "activation.hidden_copies"),
        moe_workspace=_bool(a["moe_workspace"], origin, "activation.moe_workspace"))
    g = _section(data, "cuda_graphs", {"capture", "first_capture_mib", "per_size_mib", "in_budget"}, origin,
                 frozenset({"per_size_mib_tp"}))
    _require(g["capture"] in ("vllm", "vllm-0.8", "sglang", "none"), origin,
             f"field 'cuda_graphs.capture' must be vllm, vllm-0.8, sglang or none, got {g['capture']!r}")
    graphs = CudaGraphModel(capture=g["capture"], first_capture_bytes=_mib(g["first_capture_mib"], origin,
                                                                           "cuda_graphs.first_capture_mib"),
                            per_size_bytes=_mib(g["per_size_mib"], origin, "cuda_graphs.per_size_mib"),
                            per_size_bytes_tp=_mib(g.get("per_size_mib_tp", g["per_size_mib"]), origin,
                                                   "cuda_graphs.per_size_mib_tp"),
                            in_budget=_bool(g["in_budget"], origin, "cuda_graphs.in_budget"))
    k = _section(data, "kv", {"hybrid_groups", "sliding_chunk", "concurrency"}, origin,
                 frozenset({"swa_full_tokens_ratio"}))
    _require(k["concurrency"] in ("vllm", "pool"), origin, "field 'kv.concurrency' must be vllm or pool")
    ratio = k.get("swa_full_tokens_ratio")
    kv = KVLayout(hybrid_groups=_bool(k["hybrid_groups"], origin, "kv.hybrid_groups"),
                  sliding_chunk=_bool(k["sliding_chunk"], origin, "kv.sliding_chunk"),
                  swa_full_tokens_ratio=None if ratio is None else _num(ratio, origin, "kv.swa_full_tokens_ratio",
                                                                        0.0, 1.0),
                  concurrency=k["concurrency"])
    w = _section(data, "weights", {"vocab_padding", "rotary_cache", "mla_absorbed_copy", "mxfp4_pad_hidden",
                                   "mxfp4_pad_intermediate"}, origin)
    weights = WeightLayout(vocab_padding=_int(w["vocab_padding"], origin, "weights.vocab_padding", 1),
                           rotary_cache=_bool(w["rotary_cache"], origin, "weights.rotary_cache"),
                           mla_absorbed_copy=_bool(w["mla_absorbed_copy"], origin, "weights.mla_absorbed_copy"),
                           mxfp4_pad_hidden=_int(w["mxfp4_pad_hidden"], origin, "weights.mxfp4_pad_hidden", 1),
                           mxfp4_pad_intermediate=_int(w["mxfp4_pad_intermediate"], origin,
                                                       "weights.mxfp4_pad_intermediate", 1))
    rule = None
    if data.get("static_fraction_rule") is not None:
        r = _section(data, "static_fraction_rule", {"base_mib", "per_prefill_token_mib", "per_graph_bs_mib",
                                                    "floor_mib", "tiers"}, origin)
        tiers = r["tiers"]
        _require(isinstance(tiers, list) and all(isinstance(t, list) and len(t) == 4 for t in tiers), origin,
                 "field 'static_fraction_rule.tiers' must be a list of [below_gib, chunked_prefill, bs_tp_lt4, "
                 "bs_tp_ge4]")
        rule = StaticFractionRule(
            base_mib=_num(r["base_mib"], origin, "static_fraction_rule.base_mib"),
            per_prefill_token_mib=_num(r["per_prefill_token_mib"], origin,
                                       "static_fraction_rule.per_prefill_token_mib"),
            per_graph_bs_mib=_num(r["per_graph_bs_mib"], origin, "static_fraction_rule.per_graph_bs_mib"),
            floor_mib=_num(r["floor_mib"], origin, "static_fraction_rule.floor_mib"),
            tiers=tuple((_num(t[0], origin, "tiers"), _int(t[1], origin, "tiers", 1), _int(t[2], origin, "tiers", 1),
                         _int(t[3], origin, "tiers", 1)) for t in tiers))
    _require(fraction is not None or rule is not None, origin,
             "give memory_fraction, or a static_fraction_rule that computes it")
    terms = data.get("terms", {})
    _require(isinstance(terms, dict) and set(terms) <= set(TERM_KEYS), origin,
             f"field 'terms' must map some of {', '.join(TERM_KEYS)} to the engine's names")
    sources = data.get("sources", {})
    _require(isinstance(sources, dict) and sources, origin, "field 'sources' must cite the engine source")
    return EngineSpec(
        name=str(data["name"]), version=str(data["version"]), releases=str(data["releases"]),
        display_name=str(data.get("display_name", default_name)), budget=budget, memory_fraction=fraction,
        block_size=_int(data["block_size"], origin, "block_size", 1), scheduler_defaults=tuple(defaults),
        overheads=overheads, activation=activation, cuda_graphs=graphs, kv=kv, weights=weights,
        static_fraction_rule=rule, default=_bool(data.get("default", False), origin, "default"),
        terms={str(k): str(v) for k, v in terms.items()}, sources={str(k): str(v) for k, v in sources.items()})


