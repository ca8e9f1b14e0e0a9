"""DeepSeek-V4's attention layers per engine and GPU from aiconfigurator's measured tables: the ``kernels``
``dsa_block_floors_us`` ``csa_* / hca_*`` and ``v4_prefill_efficiency`` values of presets/engines/*.yaml.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install aiconfigurator``;
its kernel tables ship in the package) and run

    PYTHONPATH=. python benchmarks/validation/dsv4_kernel_rates.py [--check]

Each engine's newest tables (aiconfigurator_core/systems/data/<gpu>/sparse_attention/<engine>/<version>/
dsv4_{csa,hca}_{context,generation}_module_perf) time one DeepSeek-V4 attention layer (projections, compressor,
the CSA layer's indexer, FlashMLA's sparse attention, the grouped output projection; no hyper-connections) with an
fp8 cache and fp8 block weights, at many batch sizes, lengths and head counts per GPU. Printed per engine, GPU and
layer kind, for DeepSeek-V4-Flash at 8 query heads per GPU (tp 8):

- ``decode``: the median over the one-sequence rows at contexts up to 512 of their time less tfcalc's work of the
  layer (its kernels without their floors): the layer's fixed cost (``<kind>_decode``), added to that work;
- ``csa top-k``: on a CSA layer, the median one-sequence row at contexts of 4,096 to 65,536 (at least twice the
  top-k's compressed entries: the selection runs in full; the tables ramp up to it from the top-k's 2,048 tokens)
  less the median at up to 512 (``csa_topk_decode``; 0 where it is not slower);
- ``prefill``: the median of the one-sequence prompts of at most 16 tokens (``<kind>_prefill``);
- ``/seq``: per layer kind, the median over the rows of 256 or more sequences at contexts up to 2,048 of their time
  less tfcalc's layer (with the values above), per sequence (``<kind>_decode_seq``): a cost per decoding sequence the
  priced kernels leave, about 0.1 us on vLLM and SGLang, its mechanism not identified;
- ``hc pre`` / ``hc post``: the hyper-connections' pre and post kernels of one layer (both sites) at their fewest
  tokens, from the engine's mhc/<version>/mhc_module_perf table (``hc_pre`` / ``hc_post``);
- ``efficiency``: the fraction of the dense bf16 peak at which the sparse prefill attention (on FlashMLA's padded
  heads' FLOPs) makes tfcalc's layer (``latency._compressed_attention_layer``, with the floors above) take the
  tables' time: the median of tfcalc / measured over both kinds' rows of prompts of 4,096 to 65,535 tokens per step
  without a cached prefix, set to 1 by bisection (``v4_prefill_efficiency``).

With ``--check`` it then prices, with the engine presets' values, every row (DeepSeek-V4-Pro's too, at 16 heads per
GPU) and prints the median tfcalc / measured per engine, GPU, model, kind, phase and band of tokens per step: what is
left is shape dependence the model lacks.
"""

from __future__ import annotations

import argparse
import glob
import statistics
from dataclasses import replace
from pathlib import Path

from tfcalc.spec.presets import load_engine

GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
ENGINES = {"vllm": "vllm-0.21", "sglang": "sglang-0.5", "trtllm": "trtllm-1.0"}
KINDS = ("csa", "hca")


def _table(root: Path, system: str, engine: str, kind: str, phase: str, model: str = "Flash"):
    import pandas as pd

    tables = sorted(glob.glob(str(root / system / "sparse_attention" / engine / "*" /
                                  f"dsv4_{kind}_{phase}_module_perf.parquet")))
    if not tables:
        return None
    d = pd.read_parquet(tables[-1])
    return d[d.model.str.contains(model, regex=False) & (d.gemm_type == "fp8_block")]


def _mhc_table(root: Path, system: str, engine: str):  # noqa: ANN202 - a pandas.DataFrame or None
    import pandas as pd

    tables = sorted(glob.glob(str(root / system / "mhc" / engine / "*" / "mhc_module_perf.parquet")))
    return pd.read_parquet(tables[-1]) if tables else None


def _layer_seconds(d, shape, kind: str) -> float:  # noqa: ANN001 - a latency.Deployment and StepShape
    """One DeepSeek-V4 attention layer of ``kind`` for ``shape``, as ``latency.step_time`` prices it."""
    from tfcalc.calc import latency

    rates = d.rates_prefill if shape.prefill_seqs else d.rates_decode
    if rates.cuda_graphs and not d.captured(shape):
        rates = latency._without_graphs(rates)
    step = latency._Step(rates)
    latency._compressed_attention_layer(step, d, shape, kind)
    return step.groups["attention"].seconds


def _work_deployment(engine: str, gpu_name: str):  # noqa: ANN201
    """DeepSeek-V4-Flash at tp 8 whose layers' fixed costs are (next to) nothing: its kernels' work alone."""
    from tfcalc.spec.presets import load_engine

    tiny = {f"{kind}_{phase}": 1e-12 for kind in KINDS for phase in ("decode", "prefill")}
    kernels = replace(load_engine(ENGINES[engine]).kernels, dsa_block_floors_by_gpu={gpu_name: tiny})
    return _deployment("deepseek-v4-flash", gpu_name, kernels)


def _deployment(model: str, gpu_name: str, kernels, tp: int = 8):  # noqa: ANN001, ANN201
    from tfcalc.calc.latency import deployment
    from tfcalc.dtypes import get_dtype, parse_weight_precision
    from tfcalc.spec.presets import load_gpu, load_model

    spec = load_model(model)
    return deployment(spec, load_gpu(gpu_name), parse_weight_precision(spec.native_dtype), get_dtype("fp8"), tp=tp,
                      engine_kernels=kernels)


def _shape(phase: str, batch: int, isl: int, step: int):  # noqa: ANN201
    from tfcalc.calc.latency import StepShape

    if phase == "context":
        return StepShape(prefill_seqs=batch, prefill_tokens=isl, prefill_past=step)
    return StepShape(decode_seqs=batch, decode_context=float(step))


def _fit(gpu_name: str, engine: str, floors: dict[str, float], rows: list[tuple[str, int, int, float]]) -> float:
    """The sparse prefill efficiency at which tfcalc's layers match the rows (median ratio 1)."""
    base = load_engine(ENGINES[engine]).kernels
    if not rows:
        return float("nan")

    def ratio(eff: float) -> float:
        kernels = replace(base, v4_prefill_efficiency_by_gpu={gpu_name: eff},
                          dsa_block_floors_by_gpu={gpu_name: {k: v * 1e-6 for k, v in floors.items()}})
        d = _deployment("deepseek-v4-flash", gpu_name, kernels)
        return statistics.median(_layer_seconds(d, _shape("context", b, n, 0), kind) / (ms * 1e-3)
                                 for kind, b, n, ms in rows)

    lo, hi = 0.02, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ratio(mid) < 1 else (mid, hi)
    return (lo + hi) / 2


def _band(phase: str, batch: int, isl: int, step: int) -> str:
    if phase == "context":
        tokens = batch * isl
        return ("<=16" if tokens <= 16 else "<4K" if tokens < 4096 else "4K-64K" if tokens < 65536 else "64K+") + (
            " +past" if step else "")
    return ("1" if batch == 1 else "2-16" if batch <= 16 else "17-128" if batch <= 128 else "129+") + (
        " ctx<=2K" if step <= 2048 else " ctx>2K")


def _check(root: Path) -> None:
    from tfcalc.spec.presets import load_engine

    print(f"{'engine':7s} {'gpu':9s} {'model':5s} {'kind':4s} {'phase':5s} {'band':15s} {'rows':>5s} "
          f"{'tfcalc/measured':>15s} {'q1':>5s} {'q3':>5s}")
    for engine, preset in ENGINES.items():
        kernels = load_engine(preset).kernels
        for system, gpu_name in GPUS.items():
            for model, heads in (("Flash", 8), ("Pro", 16)):
                d = _deployment(f"deepseek-v4-{model.lower()}", gpu_name, kernels)
                for kind in KINDS:
                    for phase in ("generation", "context"):
                        t = _table(root, system, engine, kind, phase, model)
                        if t is None or not len(t):
                            continue
                        t = t[t.num_heads == heads]
                        bands: dict[str, list[float]] = {}
                        for b, n, step, ms in zip(t.batch_size, t.isl, t.step, t.latency, strict=True):
                            got = _layer_seconds(d, _shape(phase, int(b), int(n), int(step)), kind)
                            bands.setdefault(_band(phase, int(b), int(n), int(step)), []).append(got / (ms * 1e-3))
                        for band, ratios in sorted(bands.items()):
                            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
                            print(f"{engine:7s} {gpu_name:9s} {model:5s} {kind:4s} {phase[:5]:5s} {band:15s} "
                                  f"{len(ratios):5d} {statistics.median(ratios):15.2f} {q[0]:5.2f} {q[2]:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="then price every row with the presets' values")
    args = parser.parse_args()
    import aiconfigurator_core

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    print(f"{'engine':7s} {'gpu':9s} {'csa decode':>10s} {'csa prefill':>11s} {'hca decode':>10s} "
          f"{'hca prefill':>11s} {'csa top-k':>10s} {'efficiency':>10s} {'csa /seq':>8s} {'hca /seq':>8s} "
          f"{'hc pre':>6s} {'hc post':>6s}")
    for engine in ENGINES:
        for system, gpu_name in GPUS.items():
            floors: dict[str, float] = {}
            long_rows: list[tuple[str, int, int, float]] = []
            for kind in KINDS:
                gen, ctx = (_table(root, system, engine, kind, phase) for phase in ("generation", "context"))
                if gen is None or ctx is None or not len(gen) or not len(ctx):
                    continue
                one = gen[(gen.batch_size == 1) & (gen.step <= 512) & (gen.num_heads == 8)]
                short = ctx[(ctx.batch_size == 1) & (ctx.isl <= 16) & (ctx.step == 0) & (ctx.num_heads == 8)]
                if not len(one) or not len(short):
                    continue
                work = _work_deployment(engine, gpu_name)
                floors[f"{kind}_decode"] = round(statistics.median(
                    ms * 1e3 - _layer_seconds(work, _shape("generation", 1, 1, int(step)), kind) * 1e6
                    for step, ms in zip(one.step, one.latency, strict=True)))
                floors[f"{kind}_prefill"] = round(statistics.median(short.latency) * 1e3)
                if kind == "csa":  # past top-k x ratio the selection runs: its extra fixed cost, where it has one
                    selecting = gen[(gen.batch_size == 1) & (gen.step >= 2 * 4 * 512) & (gen.step <= 65536)
                                    & (gen.num_heads == 8)]
                    floors["csa_topk_decode"] = max(round((statistics.median(selecting.latency)
                                                           - statistics.median(one.latency)) * 1e3), 0)
                every = ctx[(ctx.step == 0) & (ctx.num_heads == 8)]
                tokens = every.batch_size * every.isl
                long = every[(tokens >= 4096) & (tokens < 65536)]
                long_rows += [(kind, int(b), int(n), float(ms)) for b, n, ms in
                              zip(long.batch_size, long.isl, long.latency, strict=True)]
            if len(floors) < 4:
                continue
            eff = _fit(gpu_name, engine, floors, long_rows)
            with_floors = _deployment("deepseek-v4-flash", gpu_name, replace(
                load_engine(ENGINES[engine]).kernels, dsa_block_floors_by_gpu={
                    gpu_name: {k: v * 1e-6 for k, v in floors.items()}}))
            for kind in KINDS:  # the cost per decoding sequence the kernels leave: many sequences, short contexts
                gen = _table(root, system, engine, kind, "generation")
                many = gen[(gen.batch_size >= 256) & (gen.step <= 2048) & (gen.num_heads == 8)]
                floors[f"{kind}_decode_seq"] = round(statistics.median(
                    (ms * 1e3 - _layer_seconds(with_floors, _shape("generation", int(b), 1, int(step)), kind) * 1e6)
                    / b for b, step, ms in zip(many.batch_size, many.step, many.latency, strict=True)), 3)
            hc = _mhc_table(root, system, engine)
            if hc is not None:  # the hyper-connections' pre and post kernels of a layer at their fewest tokens
                for op in ("pre", "post"):
                    rows = hc[(hc.op_name == op) & (hc.hidden_size == 4096)]
                    floors[f"hc_{op}"] = round(float(rows.sort_values("num_tokens").latency.iloc[0]) * 1e3, 1)
            print(f"{engine:7s} {gpu_name:9s} {floors['csa_decode']:10.0f} {floors['csa_prefill']:11.0f} "
                  f"{floors['hca_decode']:10.0f} {floors['hca_prefill']:11.0f} {floors['csa_topk_decode']:10.0f} "
                  f"{eff:10.3f} {floors['csa_decode_seq']:8.3f} {floors['hca_decode_seq']:8.3f} "
                  f"{floors.get('hc_pre', float('nan')):6.1f} {floors.get('hc_post', float('nan')):6.1f}")
    if args.check:
        _check(root)


if __name__ == "__main__":
    main()
