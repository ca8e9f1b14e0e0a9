"""Every column tfcalc prints, defined once: its key (the CSV/JSON name), table header, kind and unit.

A command declares its table by picking keys from ``REGISTRY`` with ``pick``, in display order, and says when
each is shown in a table (CSV and JSON always carry every key of the rows)::

    COLUMNS = pick("model", "gpu", varies("engine", "batch"), "context", "fits", wide("capacity_bytes"))

- a plain key is shown by default (an essential column);
- ``varies(...)``: shown when its value differs between the rows (a sweep axis), else left out;
- ``wide(...)``: shown only with ``--wide`` or when named by ``--columns``;
- every other key of the rows is shown with ``--wide`` too, after these, in the rows' order.

A new key is added to ``REGISTRY`` (one line: key, header, kind, unit) before a command uses it; a test checks
that every command's columns and every key of its rows are registered. Keys say their unit
(``kv_cache_bytes``, ``ttft_s``, ``hbm_bandwidth_bytes_per_s``) and carry exact values; the kind says how a
table shows them: memory in binary units (GiB = 2^30 B), bandwidth and FLOP/s in decimal ones (GB/s =
10^9 B/s, as vendors quote them), times in s/ms/µs, fractions as percentages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Literal, NamedTuple

from tfcalc.dtypes import FLOP_DTYPES, PARAM_COMPONENTS
from tfcalc.units import format_bytes, format_params, format_seconds, format_si

Kind = Literal["text", "prose", "list", "int", "bytes", "bytes_exact", "params", "float", "percent", "bool", "seconds",
               "rate", "si", "usd"]
# "text": an identifier, never wrapped; "prose": words a table may wrap between (a word longer than a column too);
# "list": comma-separated identifiers, shown with a space after each comma so a table may wrap there; every other
# kind is a number, right-aligned and never wrapped.
Show = Literal["always", "varies", "wide"]
TEXT_KINDS = frozenset({"text", "prose", "list", "bool"})
WRAPPING_KINDS = frozenset({"prose", "list"})


class Column(NamedTuple):
    """One column: a NamedTuple, cheap to build on every CLI call (``Column(key, header, kind, unit, show)``)."""

    key: str
    header: str
    kind: Kind = "text"
    unit: str = ""  # the base unit of "si" cells ("B/s", "FLOP/s"); a "rate" column's unit, in its header too
    show: Show = "always"

    @property
    def numeric(self) -> bool:
        return self.kind not in TEXT_KINDS

    @property
    def wraps(self) -> bool:
        """Whether a table may wrap this column's cells between words."""
        return self.kind in WRAPPING_KINDS


class _Registry(Mapping[str, Column]):
    """key -> Column, each built when first asked for (a command needs a dozen of the ~300; every CLI call pays for
    what it builds). A key registered twice is an error at import. ``families`` register keys that a command builds
    from its input (a latency target's percentile): (regular expression, the spec of a matching key); iterating
    gives the fixed keys only."""

    def __init__(self, *specs: tuple[str, ...],
                 families: tuple[tuple[str, Callable[[re.Match[str]], tuple[str, ...]]], ...] = ()) -> None:
        self._specs: dict[str, tuple[str, ...]] = {}
        for spec in specs:
            if spec[0] in self._specs:
                raise ValueError(f"column '{spec[0]}' registered twice")
            self._specs[spec[0]] = spec
        self._families = tuple((re.compile(pattern), build) for pattern, build in families)
        self._built: dict[str, Column] = {}

    def _spec(self, key: str) -> tuple[str, ...] | None:
        spec = self._specs.get(key)
        if spec is None:
            for pattern, build in self._families:
                match = pattern.fullmatch(key)
                if match:
                    return (key, *build(match))
        return spec

    def __getitem__(self, key: str) -> Column:
        built = self._built.get(key)
        if built is None:
            spec = self._spec(key)
            if spec is None:
                raise KeyError(key)
            built = self._built[key] = Column(*spec)  # type: ignore[arg-type]
        return built

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._spec(key) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


# The latency model's op groups (tfcalc.calc.latency.GROUPS, labelled as in report/estimate's --explain) and its
# fixed costs: estimate writes one time per phase and group (the registry test checks every key is here).
_STEP_GROUPS = {"attention": "attention", "dense_ffn": "dense FFN", "moe": "MoE", "lm_head": "embedding + lm_head",
                "communication": "communication", "floors": "fixed costs"}

_TARGET_METRICS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}

REGISTRY: Mapping[str, Column] = _Registry(
    # --- what a row is about: model, hardware, engine, parallelism, shape ------------------------------------------
    ("model", "model"), ("gpu", "GPU"), ("engine", "engine"), ("engine_display_name", "engine name", "prose"),
    ("model_runner", "model runner"),
    ("num_gpus", "GPUs", "int"), ("tp", "tp", "int"), ("pp", "pp", "int"), ("ep", "ep", "int"), ("dp", "dp", "int"),
    ("redundant_experts", "redundant experts", "int"),
    ("context", "context", "int"), ("batch", "batch", "int"), ("prompt_len", "prompt", "int"),
    ("gen_len", "gen", "int"), ("weights_dtype", "weights dtype", "list"), ("kv_dtype", "KV dtype"),
    ("compute_dtype", "compute dtype"), ("dtype", "dtype"), ("native_dtype", "native dtype", "list"),
    ("attention", "attention"), ("layers", "layers", "int"), ("kv_heads", "KV heads", "int"),
    ("heads", "heads", "int"), ("head_dim", "head dim", "int"), ("hidden_size", "hidden", "int"),
    ("sliding_window", "sliding window", "prose"), ("max_context", "max context", "int"),
    ("exceeds_max_context", "over max context", "bool"), ("note", "note", "prose"), ("status", "status", "prose"),
    # --- kv-cache ----------------------------------------------------------------------------------------------------
    ("kv_bytes_per_token", "bytes per token", "bytes_exact"), ("kv_cache_bytes", "KV cache", "bytes"),
    ("kv_cache_bytes_uncapped", "without window caps", "bytes"),
    ("state_bytes", "fixed state", "bytes"), ("linear_layers", "recurrent layers", "int"),
    # --- params: the summary (abbreviated) and the breakdown table (exact) -----------------------------------------
    ("total_params", "total params", "params"), ("active_params", "active params", "params"),
    ("non_embedding_params", "non-embedding", "params"), ("active_convention", "active convention", "prose"),
    *((f"{c}_params", f"{c} params", "int") for c in PARAM_COMPONENTS),
    *((f"{c}_active_params", f"{c} active params", "int") for c in PARAM_COMPONENTS),
    ("component", "component"), ("component_params", "params", "int"),
    ("component_active_params", "active per token", "int"), ("share_of_total", "share of total", "percent"),
    # --- memory --------------------------------------------------------------------------------------------------
    ("weights_bytes", "weights", "bytes"), ("activation_bytes", "activations", "bytes"),
    ("total_bytes", "total", "bytes"),
    *((f"{c}_weights_bytes", f"{c} weights", "bytes") for c in PARAM_COMPONENTS),
    # --- plan ----------------------------------------------------------------------------------------------------
    ("weights_bytes_per_gpu", "weights per GPU", "bytes"), ("kv_budget_bytes_per_gpu", "KV per GPU", "bytes"),
    ("kv_tokens_per_gpu", "KV tokens", "int"), ("max_concurrent_sequences", "max seqs", "int"),
    ("max_context_at_batch", "max context at batch", "int"), ("fits", "fits", "bool"),
    ("gpu_memory_bytes", "GPU memory", "bytes"), ("capacity_bytes", "capacity", "bytes"),
    ("memory_fraction", "memory fraction", "float"), ("reserved_bytes_per_gpu", "reserved per GPU", "bytes"),
    ("activation_peak_bytes", "activation peak", "bytes"), ("non_torch_bytes", "non-torch", "bytes"),
    ("cuda_graph_bytes", "CUDA graphs", "bytes"), ("cuda_graphs_in_budget", "CUDA graphs subtracted", "bool"),
    ("startup_bytes", "startup", "bytes"), ("runtime_overhead_bytes_per_gpu", "runtime overhead per GPU", "bytes"),
    ("kv_bytes_per_token_per_gpu", "KV bytes per token per GPU", "bytes_exact"),
    ("kv_bytes_per_sequence_per_gpu", "KV per sequence per GPU", "bytes"),
    ("kv_blocks_per_gpu", "KV blocks per GPU", "int"), ("kv_pool_blocks_per_gpu", "KV pool blocks per GPU", "int"),
    ("kv_groups", "KV groups", "int"), ("block_size", "block size", "int"),
    ("max_num_seqs", "max_num_seqs", "int"), ("max_num_batched_tokens", "max_num_batched_tokens", "int"),
    ("max_concurrent_sequences_window_aware", "max seqs window-aware", "int"),
    ("kv_budget_bytes_per_gpu_ideal", "KV per GPU ideal", "bytes"),
    ("max_concurrent_sequences_ideal", "max seqs ideal", "int"),
    ("weights_bytes_per_gpu_ideal", "weights per GPU ideal", "bytes"),
    ("shortfall_bytes_per_gpu", "shortfall per GPU", "bytes"), ("reason", "verdict", "prose"),
    # --- estimate (and profile's measured and predicted times) ------------------------------------------------------
    ("ttft_s", "TTFT", "seconds"), ("ttft_s_ideal", "TTFT ideal", "seconds"), ("tpot_s", "TPOT", "seconds"),
    ("tpot_s_ideal", "TPOT ideal", "seconds"), ("e2e_s", "end to end", "seconds"),
    ("e2e_s_ideal", "end to end ideal", "seconds"),
    ("prefill_tokens_per_s", "prefill tok/s", "rate", "tok/s"),
    ("decode_tokens_per_s", "decode tok/s", "rate", "tok/s"),
    ("decode_tokens_per_s_ideal", "decode tok/s ideal", "rate", "tok/s"),
    ("decode_tokens_per_s_per_seq", "tok/s per user", "rate", "tok/s"),
    ("decode_tokens_per_s_per_seq_ideal", "tok/s per user ideal", "rate", "tok/s"),
    ("prefill_bound", "prefill bound"), ("decode_bound", "decode bound"),
    ("prefill_limited_by", "prefill limited by", "prose"), ("decode_limited_by", "decode limited by", "prose"),
    ("prefill_flops", "prefill FLOPs", "si", "FLOP"), ("prefill_bytes", "prefill bytes", "bytes"),
    ("decode_flops_per_step", "decode FLOPs per step", "si", "FLOP"),
    ("decode_bytes_per_step", "decode bytes per step", "bytes"),
    ("decode_traffic_bytes_per_step", "decode traffic per step", "bytes"),
    ("decode_weight_bytes_per_step", "decode weights per step", "bytes"),
    ("decode_kv_bytes_per_step", "decode KV per step", "bytes"), ("decode_context", "decode context", "int"),
    ("prefill_arithmetic_intensity", "prefill FLOP per byte", "float"),
    ("decode_arithmetic_intensity", "decode FLOP per byte", "float"),
    ("ridge_flops_per_byte", "ridge FLOP per byte", "float"),
    *((f"{phase}_{group}_s", f"{phase} {label}", "seconds") for phase in ("prefill", "decode")
      for group, label in _STEP_GROUPS.items()),
    ("prefill_tp_comm_s", "prefill tp comm", "seconds"), ("prefill_ep_comm_s", "prefill ep comm", "seconds"),
    ("prefill_pp_s", "prefill pp", "seconds"), ("decode_tp_comm_s", "decode tp comm", "seconds"),
    ("decode_ep_comm_s", "decode ep comm", "seconds"), ("decode_pp_s", "decode pp", "seconds"),
    ("prefill_allreduce_s", "prefill all-reduce", "seconds"), ("decode_allreduce_s", "decode all-reduce", "seconds"),
    ("pipeline_microbatches", "microbatches", "int"), ("decode_bubble_fraction", "decode bubble", "percent"),
    ("peak_flops_per_s", "peak compute", "si", "FLOP/s"),
    ("hbm_bandwidth_bytes_per_s", "HBM bandwidth", "si", "B/s"),
    ("gemm_efficiency", "GEMM efficiency", "percent"), ("memory_efficiency", "HBM efficiency", "percent"),
    ("efficiency_source", "rates from", "prose"), ("decode_turning_point_batch", "compute-bound from batch", "int"),
    # --- presets -------------------------------------------------------------------------------------------------
    ("kind", "kind"), ("name", "preset"), ("display_name", "name", "prose"), ("experts", "experts", "int"),
    ("experts_per_token", "experts per token", "int"), ("moe", "experts"),
    *((f"{d}_dense_flops_per_s", f"{d} dense", "si", "FLOP/s") for d in FLOP_DTYPES),
    ("interconnect", "interconnect", "prose"),
    ("interconnect_bandwidth_bytes_per_s", "link one way", "si", "B/s"),
    ("link_bandwidth_bytes_per_s", "bandwidth one way", "si", "B/s"), ("nccl_algorithm", "NCCL algorithm"),
    ("custom_allreduce", "custom all-reduce", "bool"), ("releases", "releases"),
    ("default", "default", "bool"), ("budget", "memory model"),
    ("field", "field", "prose"), ("value", "value", "prose"), ("source", "source", "prose"), ("ref", "source"),
    # --- profile (measured on this device) -----------------------------------------------------------------------
    ("device", "device"), ("device_name", "device name", "prose"), ("gpu_preset", "GPU preset"),
    ("layers_run", "layers", "int"), ("layers_total", "of", "int"), ("layer_pattern", "layers run", "prose"),
    ("fp8_gemm", "FP8 GEMM"), ("attn_backend", "SDPA backend"), ("decode_attention", "decode attention"),
    ("compiled", "compiled", "bool"), ("ttft_spread", "TTFT spread", "percent"),
    ("tpot_spread", "TPOT spread", "percent"), ("achieved_flops_per_s", "achieved compute", "si", "FLOP/s"),
    ("mfu_datasheet", "MFU", "percent"), ("mfu_measured", "MFU (measured peak)", "percent"),
    ("decode_context_mean", "decode context", "float"), ("kv_bytes_read_per_step", "KV read per step", "bytes"),
    ("achieved_bytes_per_s", "bandwidth", "si", "B/s"), ("mbu_datasheet", "MBU", "percent"),
    ("mbu_measured", "MBU (measured copy)", "percent"), ("peak_memory_bytes", "peak memory", "bytes"),
    ("predicted_memory_bytes", "predicted memory", "bytes"), ("predicted_ttft_s", "predicted TTFT", "seconds"),
    ("predicted_tpot_s", "predicted TPOT", "seconds"),
    ("predicted_decode_tokens_per_s", "predicted decode tok/s", "rate", "tok/s"),
    ("measured_over_predicted", "measured / predicted", "float"),
    ("prediction_basis", "prediction basis", "prose"),
    ("copy_bandwidth_bytes_per_s", "copy bandwidth", "si", "B/s"),
    ("matmul_flops_per_s", "matmul compute", "si", "FLOP/s"),
    ("datasheet_bandwidth_bytes_per_s", "datasheet bandwidth", "si", "B/s"),
    ("datasheet_flops_per_s", "datasheet compute", "si", "FLOP/s"),
    ("memory_clock_hz", "memory clock", "si", "Hz"),
    ("memory_bus_width_bits", "memory bus bits", "int"),
    ("nvml_bandwidth_bytes_per_s", "NVML bandwidth", "si", "B/s"), ("sm_clock_hz", "SM clock", "si", "Hz"),
    ("power_w", "power", "si", "W"), ("power_limit_w", "power limit", "si", "W"),
    ("temperature_c", "temperature °C", "float"), ("driver", "driver"), ("device_note", "device note", "prose"),
    ("distinct_experts_per_moe_layer", "distinct experts per MoE layer", "float"),
    # --- profile on several ranks (tfcalc.profile.sweep.parallel_columns) -------------------------------------------
    ("world_size", "ranks", "int"), ("dist_backend", "backend"),
    ("prefill_comm_s", "prefill comm", "seconds"), ("prefill_comm_s_max", "prefill comm max", "seconds"),
    ("decode_comm_s", "comm per step", "seconds"), ("decode_comm_s_max", "comm per step max", "seconds"),
    ("decode_comm_fraction", "comm share of TPOT", "percent"),
    ("collectives_per_prefill", "collectives per prefill", "int"),
    ("collectives_per_decode_step", "collectives per step", "float"),
    ("predicted_prefill_comm_s", "predicted prefill comm", "seconds"),
    ("predicted_decode_comm_s", "predicted comm per step", "seconds"),
    # --- capacity (tfcalc.report.capacity: one row per configuration, or long format) -------------------------------
    ("role", "role"), ("mode", "mode"), ("layout", "layout"), ("formats", "weights/KV"),
    ("seqs_chunk", "seqs/chunk"), ("speculative_tokens", "draft tokens", "int"),
    ("feasible", "meets targets", "bool"), ("replicas", "replicas", "int"), ("prefill_tp", "prefill tp", "int"),
    ("prefill_ep", "prefill ep", "int"), ("prefill_replicas", "prefill replicas", "int"),
    ("price_per_gpu_hour", "$ per GPU-hour", "usd"), ("cost_per_hour", "$ per hour", "usd"),
    ("cost_per_million_input_tokens", "$ per M input tokens", "usd"),
    ("cost_per_million_output_tokens", "$ per M output tokens", "usd"),
    ("capacity_requests_per_s_per_replica", "req/s per replica", "rate", "req/s"),
    ("kv_capacity_tokens_per_replica", "KV tokens per replica", "int"), ("binding_constraint", "binding", "prose"),
    ("frontier_output_tokens_per_s_per_user", "tok/s per user", "rate", "tok/s"),
    ("frontier_output_tokens_per_s_per_gpu", "tok/s per GPU", "rate", "tok/s"),
    ("launch_command", "launch command", "prose"), ("metric", "metric"), ("unit", "unit"),
    # --- bench attention | moe | ceilings | calibrate ----------------------------------------------------------------
    ("backend", "backend"), ("backend_ran", "ran"), ("gqa_ratio", "GQA ratio", "int"), ("seq_len", "seq len", "int"),
    ("phase", "phase"), ("causal", "causal", "bool"), ("flops", "FLOPs", "si", "FLOP"), ("bytes", "bytes", "bytes"),
    ("time_s", "time", "seconds"), ("time_p25_s", "time p25", "seconds"), ("time_p75_s", "time p75", "seconds"),
    ("flops_per_s", "compute", "si", "FLOP/s"), ("tflops_per_s", "TFLOP/s", "float"),
    ("bytes_per_s", "bandwidth", "si", "B/s"), ("flops_fraction_of_peak", "of peak FLOP/s", "percent"),
    ("bandwidth_fraction_of_peak", "of peak bandwidth", "percent"), ("hidden", "hidden", "int"),
    ("expert_intermediate", "expert width", "int"), ("dense_intermediate", "dense width", "int"),
    ("moe_params", "MoE params", "int"), ("moe_active_params", "MoE active params", "int"),
    ("dense_params", "dense params", "int"), ("tokens", "tokens", "int"), ("moe_time_s", "MoE time", "seconds"),
    ("dense_time_s", "dense time", "seconds"), ("moe_tokens_per_s", "MoE tok/s", "rate", "tok/s"),
    ("dense_tokens_per_s", "dense tok/s", "rate", "tok/s"), ("moe_over_dense", "MoE / dense", "float"),
    ("max_tokens_per_expert", "max per expert", "int"), ("mean_tokens_per_expert", "mean per expert", "float"),
    ("load_imbalance", "max / mean", "float"), ("distinct_experts", "distinct experts", "int"),
    ("expected_distinct_experts", "expected distinct", "float"), ("ceiling", "ceiling"), ("size", "size", "int"),
    ("size_unit", "size unit", "prose"), ("work_per_call", "work per call", "int"), ("work_unit", "work unit", "prose"),
    ("spread", "IQR / median", "percent"), ("repeats", "repeats", "int"), ("sweep", "sweep"),
    ("shape", "shape", "prose"), ("m", "m", "int"), ("n", "n", "int"), ("k", "k", "int"),
    ("p25_bytes_per_s", "bandwidth p25", "si", "B/s"), ("p75_bytes_per_s", "bandwidth p75", "si", "B/s"),
    ("p25_flops_per_s", "compute p25", "si", "FLOP/s"), ("p75_flops_per_s", "compute p75", "si", "FLOP/s"),
    # --- bench collectives (nccl-tests' definitions: tfcalc.profile.collectives) -------------------------------------
    ("op", "op"), ("algbw_bytes_per_s", "algbw", "si", "B/s"), ("busbw_bytes_per_s", "busbw", "si", "B/s"),
    ("fitted_time_s", "fitted time", "seconds"), ("fit_residual", "fit residual", "percent"),
    ("fit_outlier", "left out of the fit", "bool"),
    families=(
        # capacity's latency at the operating point, one key per target: operating_ttft_p90_s, operating_tpot_mean_s
        (r"operating_(ttft|tpot|itl|e2e)_(mean|p\d+(?:_\d+)?)_s",
         lambda m: (f"{_TARGET_METRICS[m[1]]} {m[2].replace('_', '.')}", "seconds")),
    ),
)


class TableView(NamedTuple):
    """Which columns a table shows: the command's default (essential, and sweep axes that vary), every column
    (``wide``, from ``--wide``), or exactly ``keys`` (``--columns``)."""

    wide: bool = False
    keys: tuple[str, ...] = ()


DEFAULT_VIEW = TableView()


class _Marked:
    """Keys picked with a show rule other than "always" (``varies``, ``wide``)."""

    def __init__(self, keys: tuple[str, ...], show: Show) -> None:
        self.keys, self.show = keys, show


def varies(*keys: str) -> _Marked:
    """Columns shown when their value differs between the rows (sweep axes such as engine, batch, dtype)."""
    return _Marked(keys, "varies")


def wide(*keys: str) -> _Marked:
    """Columns shown only with ``--wide`` or ``--columns`` (always in CSV/JSON)."""
    return _Marked(keys, "wide")


def column(key: str) -> Column:
    """The registered column ``key``."""
    try:
        return REGISTRY[key]
    except KeyError:
        raise KeyError(f"column '{key}' is not in tfcalc.output.columns.REGISTRY: register it there first") from None


def pick(*items: str | _Marked) -> list[Column]:
    """A table's columns in display order: keys shown by default, and ``varies(...)`` / ``wide(...)`` groups."""
    picked: list[Column] = []
    for item in items:
        keys, show = ((item,), "always") if isinstance(item, str) else (item.keys, item.show)
        picked += [column(key)._replace(show=show) for key in keys]
    return picked


def suggest_columns(key: str, choices: Iterable[str]) -> list[str]:
    import difflib

    return difflib.get_close_matches(key, list(choices), n=3, cutoff=0.6)


# --- cells ------------------------------------------------------------------------------------------------------


def format_cell(value: object, column: Column) -> str:
    """A value as a table shows it (``—`` for none); exact values stay in the rows."""
    if value is None:
        return "—"
    if column.kind == "bool":
        return "yes" if value else "no"
    if column.kind == "list":
        return ", ".join(item.strip() for item in str(value).split(","))
    if isinstance(value, bool):  # a flag in a column of words (a preset's field values): as YAML writes it
        return "true" if value else "false"
    if isinstance(value, str) or not column.numeric:
        return str(value)
    if not isinstance(value, (int, float)):
        return str(value)
    if column.kind == "bytes":
        return format_bytes(value)
    if column.kind == "bytes_exact":
        return f"{value:,} B"
    if column.kind == "params":
        return format_params(value)
    if column.kind == "int":
        return f"{value:,}"
    if column.kind == "percent":
        return f"{value * 100:.1f} %"
    if column.kind == "si":
        return format_si(value, column.unit)
    if column.kind == "seconds":
        return format_seconds(value)
    if column.kind == "rate":  # the unit is in the header: "decode tok/s"
        return f"{value:,.1f}"
    if column.kind == "usd":  # dollars: cents from $1 up, else three significant digits ($0.0614)
        return f"${value:,.2f}" if abs(value) >= 1 else f"${value:.3g}"
    return f"{value:,.4g}"
