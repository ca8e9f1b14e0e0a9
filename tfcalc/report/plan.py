"""Plan and estimate results as rows (required columns first, exact integers for bytes). No I/O."""

from __future__ import annotations

import itertools
from dataclasses import replace

from tfcalc.calc.plan import PlanConfig, PlanResult, min_gpus, plan_fit
from tfcalc.calc.roofline import Efficiency, Estimate, estimate
from tfcalc.dtypes import DType, WeightPrecision, parse_weight_precision
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec

Row = dict[str, object]


def _plan_row(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, cfg: PlanConfig,
              r: PlanResult) -> Row:
    p = r.parallelism
    return {
        "model": spec.name, "gpu": gpu.name, "num_gpus": p.num_gpus, "tp": p.tp, "pp": p.pp,
        "context": cfg.context, "batch": cfg.batch, "weights_dtype": precision.label, "kv_dtype": kv_dtype.name,
        "weights_bytes_per_gpu": r.weights_bytes_per_gpu, "kv_bytes_per_token_per_gpu": r.kv_bytes_per_token_per_gpu,
        "reserved_bytes_per_gpu": r.reserved_bytes_per_gpu, "kv_budget_bytes_per_gpu": r.kv_budget_bytes_per_gpu,
        "max_concurrent_sequences": r.max_concurrent_sequences, "max_context_at_batch": r.max_context_at_batch,
        "fits": r.fits,
        "ep": p.ep, "dp": p.dp, "gpu_memory_bytes": r.memory_bytes_per_gpu,
        "gpu_memory_utilization": cfg.gpu_memory_utilization, "block_size": cfg.block_size,
        "activation_bytes_per_gpu": r.activation_bytes_per_gpu,
        "kv_bytes_per_sequence_per_gpu": r.kv_bytes_per_sequence_per_gpu, "kv_blocks_per_gpu": r.kv_blocks_per_gpu,
        "runtime_overhead_bytes_per_gpu": cfg.runtime_overhead_bytes, "prefill_chunk_tokens": cfg.prefill_chunk_tokens,
        "shortfall_bytes_per_gpu": r.shortfall_bytes_per_gpu, "reason": r.reason,
    }


def plan_rows(specs: list[ModelSpec], gpus: list[GPUSpec], num_gpus: list[int], tps: list[int], pps: list[int],
              eps: list[int], contexts: list[int], batches: list[int], precisions: list[WeightPrecision],
              kv_dtypes: list[DType], utilizations: list[float], block_sizes: list[int], runtime_overheads: list[int],
              prefill_chunks: list[int], find_min_gpus: bool = False, max_gpus: int = 512,
              gpus_per_node: int = 8) -> tuple[list[Row], list[tuple[str, ...]]]:
    """One row per combination (sweeps multiply); with ``find_min_gpus`` the GPU count is searched, over the
    layouts ``candidate_layouts`` allows (``tps`` / ``pps``, when given, restrict them)."""
    from tfcalc.calc.kv_cache import default_kv_dtype
    from tfcalc.errors import UsageError

    if find_min_gpus and (num_gpus or any(ep != 1 for ep in eps)):
        raise UsageError("--min-gpus searches the GPU count: drop --num-gpus (and --ep, which it does not search)")
    rows: list[Row] = []
    traces: list[tuple[str, ...]] = []
    for spec, gpu in itertools.product(specs, gpus):
        for precision, kv_dtype, context, batch, util, block, overhead, chunk in itertools.product(
                precisions or [parse_weight_precision(spec.native_dtype)], kv_dtypes or [default_kv_dtype(spec)],
                contexts or [spec.max_context], batches, utilizations, block_sizes, runtime_overheads,
                prefill_chunks):
            base = PlanConfig(num_gpus=1, context=context, batch=batch, gpu_memory_utilization=util,
                              block_size=block, runtime_overhead_bytes=overhead, prefill_chunk_tokens=chunk)
            if find_min_gpus:
                r = min_gpus(spec, gpu, precision, kv_dtype, base, max_gpus, gpus_per_node, tps or None, pps or None)
                if r is None:
                    raise UsageError(f"{spec.name} batch {batch} at context {context:,} does not fit on up to "
                                     f"{max_gpus} x {gpu.name} ({precision.label}, KV {kv_dtype.name})")
                cfg = replace(base, num_gpus=r.parallelism.num_gpus, tp=r.parallelism.tp, pp=r.parallelism.pp)
                rows.append(_plan_row(spec, gpu, precision, kv_dtype, cfg, r))
                traces.append(r.trace)
                continue
            for n, tp, pp, ep in itertools.product(num_gpus or [1], tps or [0], pps or [1], eps):
                if not tp and n % pp:
                    raise UsageError(f"pp {pp} does not divide the GPU count {n}")
                cfg = replace(base, num_gpus=n, tp=tp or n // pp, pp=pp, ep=ep)
                r = plan_fit(spec, gpu, precision, kv_dtype, cfg)
                rows.append(_plan_row(spec, gpu, precision, kv_dtype, cfg, r))
                traces.append(r.trace)
    return rows, traces


def _estimate_row(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, e: Estimate) -> Row:
    pre, dec = e.prefill, e.decode
    return {
        "model": spec.name, "gpu": gpu.name, "tp": e.tp, "batch": e.batch, "prompt_len": e.prompt_len,
        "gen_len": e.gen_len, "prefill_flops": round(pre.flops), "ttft_s": e.ttft_s, "ttft_s_ideal": e.ttft_s_ideal,
        "decode_bytes_per_step": round(dec.bytes), "tpot_s": e.tpot_s, "tpot_s_ideal": e.tpot_s_ideal,
        "decode_tokens_per_s": e.decode_tokens_per_s, "decode_tokens_per_s_ideal": e.decode_tokens_per_s_ideal,
        "prefill_bound": pre.bound, "decode_bound": dec.bound,
        "weights_dtype": precision.label, "kv_dtype": kv_dtype.name, "compute_dtype": pre.compute_dtype,
        "prefill_bytes": round(pre.bytes), "decode_flops_per_step": round(dec.flops),
        "decode_context": e.decode_context,
        "prefill_arithmetic_intensity": pre.arithmetic_intensity,
        "decode_arithmetic_intensity": dec.arithmetic_intensity,
        "ridge_flops_per_byte": pre.peak_flops / pre.bandwidth,
        "prefill_allreduce_s": pre.time_comm_s, "decode_allreduce_s": dec.time_comm_s,
        "decode_tokens_per_s_per_seq": e.decode_tokens_per_s_per_seq,
        "decode_tokens_per_s_per_seq_ideal": e.decode_tokens_per_s_per_seq_ideal,
        "e2e_s": e.e2e_s, "e2e_s_ideal": e.e2e_s_ideal, "decode_turning_point_batch": e.turning_point_batch,
        "peak_flops_per_s": pre.peak_flops, "hbm_bandwidth_bytes_per_s": pre.bandwidth,
        "compute_efficiency_prefill": e.efficiency.compute_prefill,
        "compute_efficiency_decode": e.efficiency.compute_decode,
        "bandwidth_efficiency_prefill": e.efficiency.bandwidth_prefill,
        "bandwidth_efficiency_decode": e.efficiency.bandwidth_decode, "efficiency_source": e.efficiency.source,
    }


def estimate_rows(specs: list[ModelSpec], gpus: list[GPUSpec], tps: list[int], batches: list[int],
                  prompt_lens: list[int], gen_lens: list[int], precisions: list[WeightPrecision],
                  kv_dtypes: list[DType], efficiencies: list[Efficiency]) -> tuple[list[Row], list[tuple[str, ...]]]:
    from tfcalc.calc.kv_cache import default_kv_dtype

    rows: list[Row] = []
    traces: list[tuple[str, ...]] = []
    for spec, gpu in itertools.product(specs, gpus):
        for precision, kv_dtype, tp, batch, prompt, gen, eff in itertools.product(
                precisions or [parse_weight_precision(spec.native_dtype)], kv_dtypes or [default_kv_dtype(spec)],
                tps, batches, prompt_lens, gen_lens, efficiencies):
            e = estimate(spec, gpu, precision, kv_dtype, tp, batch, prompt, gen, eff)
            rows.append(_estimate_row(spec, gpu, precision, kv_dtype, e))
            traces.append(e.trace)
    return rows, traces
