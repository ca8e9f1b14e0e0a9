"""PNG charts for ``plan --plot`` and ``estimate --plot``. matplotlib (the ``plot`` extra) is imported only here,
inside the functions, with the non-interactive Agg backend; files are written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfcalc.errors import UsageError

GIB = 1 << 30


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'tfcalc[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def check_plot_path(path: Path) -> None:
    """``--plot`` writes PNG: a .png file name, or stdout (``-``) or a device such as /dev/null."""
    from tfcalc.output.files import is_stdout

    if path.suffix.lower() != ".png" and not is_stdout(path) and not str(path).startswith(("/dev/", "/proc/")):
        raise UsageError(f"--plot writes PNG: give a .png file name, got '{path}'")


def _save(fig: Any, path: Path) -> None:
    check_plot_path(path)
    from tfcalc.output.files import open_output

    with open_output(path, binary=True) as handle:
        fig.savefig(handle, format="png", dpi=110, bbox_inches="tight")


def plot_plan(path: Path, specs: list, gpus: list, rows: list[dict], precisions: list, kv_dtypes: list,
              engines: list | None = None) -> None:
    """Memory per GPU (weights + reserved + KV at the first batch) vs context, one line per weight/KV precision
    of the first model's first layout, with each GPU's capacity as a horizontal line."""
    from tfcalc.calc.kv_cache import default_kv_dtype
    from tfcalc.calc.plan import PlanConfig, plan_fit
    from tfcalc.dtypes import parse_weight_precision
    from tfcalc.spec.engine import memory_model

    plt = _pyplot()
    first = rows[0]
    spec = next(s for s in specs if s.name == first["model"])
    gpu = next(g for g in gpus if g.name == first["gpu"])
    batch = int(first["batch"])
    engine = next((e for e in engines or [] if (e.label if e is not None else "ideal") == first["engine"]), None)
    contexts = sorted({int(2 ** (i / 2)) for i in range(20, 2 * max(spec.max_context, 1 << 10).bit_length() - 1)})
    fig, ax = plt.subplots(figsize=(8, 5))
    for precision in precisions or [parse_weight_precision(spec.native_dtype)]:
        for kv in kv_dtypes or [default_kv_dtype(spec)]:
            ys = []
            for c in contexts:
                cfg = PlanConfig(num_gpus=int(first["num_gpus"]), tp=int(first["tp"]), pp=int(first["pp"]),
                                 ep=int(first["ep"]), context=c, batch=batch, engine=engine,
                                 gpu_memory_utilization=float(first["memory_fraction"]),
                                 block_size=int(first["block_size"]), max_num_seqs=int(first["max_num_seqs"]),
                                 max_num_batched_tokens=int(first["max_num_batched_tokens"]),
                                 **({} if memory_model(engine) is not None else
                                    {"runtime_overhead_bytes": int(first["runtime_overhead_bytes_per_gpu"])}))
                r = plan_fit(spec, gpu, precision, kv, cfg)
                per_replica = -(-batch // r.parallelism.dp)
                ys.append((r.weights_bytes_per_gpu + r.reserved_bytes_per_gpu
                           + per_replica * r.kv_bytes_per_sequence_per_gpu) / GIB)
            ax.plot(contexts, ys, marker=".", label=f"weights {precision.label}, KV {kv.name}")
    for g in gpus:
        ax.axhline(g.memory_bytes / GIB, linestyle="--", color="black", linewidth=1)
        ax.text(contexts[0], g.memory_bytes / GIB, f" {g.name} capacity {g.memory_bytes / GIB:.0f} GiB",
                va="bottom", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("memory per GPU (GiB): weights + reserved + KV")
    ax.set_title(f"{spec.name} on {first['num_gpus']} x {gpu.name} (tp {first['tp']}, pp {first['pp']}), "
                 f"batch {batch}")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    _save(fig, path)
    plt.close(fig)


def plot_roofline(path: Path, rows: list[dict]) -> None:
    """Attainable FLOP/s vs arithmetic intensity for each GPU, with the prefill and decode points of every row."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    seen: set[tuple[str, float, float]] = set()
    intensities = [float(r[k]) for r in rows for k in ("prefill_arithmetic_intensity", "decode_arithmetic_intensity")]
    lo, hi = max(min(intensities) / 4, 1e-2), max(intensities) * 4
    xs = [lo * (hi / lo) ** (i / 100) for i in range(101)]
    for r in rows:
        key = (str(r["gpu"]), float(r["peak_flops_per_s"]), float(r["hbm_bandwidth_bytes_per_s"]))
        if key not in seen:
            seen.add(key)
            peak, bw = key[1], key[2]
            ax.plot(xs, [min(peak, x * bw) for x in xs], label=f"{key[0]} roofline ({r['compute_dtype']})")
        for phase, marker in (("prefill", "o"), ("decode", "s")):
            if phase == "prefill":
                flops, t = float(r["prefill_flops"]), float(r["ttft_s_ideal"])
            else:
                flops, t = float(r["decode_flops_per_step"]), float(r["tpot_s_ideal"])
            ax.scatter([float(r[f"{phase}_arithmetic_intensity"])], [flops / t], marker=marker, zorder=3,
                       label=f"{phase}: {r['model']} b{r['batch']} p{r['prompt_len']}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s per GPU (ideal)")
    ax.set_title("Roofline: prefill and decode")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    _save(fig, path)
    plt.close(fig)


def plot_profile(path: Path, rows: list[dict]) -> None:
    """Time per output token vs the context decode reads, measured (dots) beside the prediction (dashed), one
    colour per model, weight format, batch and device of the ``tfcalc profile`` rows that measured."""
    plt = _pyplot()
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("tpot_s") is not None and r.get("decode_context_mean") is not None:
            key = (r["model"], r["weights_dtype"], r["batch"], r["device"])
            series.setdefault(key, []).append(r)
    if not series:
        raise UsageError("--plot: no measured rows to plot")
    fig, ax = plt.subplots(figsize=(8, 5))
    for (model, weights, batch, device), points in series.items():
        points.sort(key=lambda r: float(r["decode_context_mean"]))
        xs = [float(r["decode_context_mean"]) for r in points]
        line = ax.plot(xs, [float(r["tpot_s"]) * 1e3 for r in points], marker="o",
                       label=f"{model} {weights} batch {batch} on {device}: measured")[0]
        ax.plot(xs, [float(r["predicted_tpot_s"]) * 1e3 for r in points], linestyle="--", color=line.get_color(),
                label="predicted")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context read per decode step (tokens, mean over the timed steps)")
    ax.set_ylabel("time per output token (ms)")
    ax.set_title("tfcalc profile: decode time per token vs context")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    _save(fig, path)
    plt.close(fig)


def plot_capacity(path: Path, points: list[dict], tpot_targets: list[tuple[str, float]], title: str) -> None:
    """Output tokens/s per GPU vs tokens/s per user for every configuration that fits (each at the most traffic
    it carries within the TTFT targets), the Pareto frontier as a line, the chosen plan as a star and each TPOT
    target as a vertical line at 1 / TPOT (configurations right of it meet it)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    gpus = sorted({str(p["gpu"]) for p in points})
    for gpu in gpus:
        mine = [p for p in points if p["gpu"] == gpu]
        ax.scatter([float(p["tokens_per_user"]) for p in mine], [float(p["tokens_per_gpu"]) for p in mine], s=8,
                   alpha=0.35, label=gpu)
    front = sorted((p for p in points if p["frontier"]), key=lambda p: float(p["tokens_per_user"]))
    if front:
        ax.plot([float(p["tokens_per_user"]) for p in front], [float(p["tokens_per_gpu"]) for p in front],
                color="black", linewidth=1.2, marker="o", markersize=3, label="Pareto frontier")
    for p in points:
        if p["chosen"]:
            ax.scatter([float(p["tokens_per_user"])], [float(p["tokens_per_gpu"])], marker="*", s=220,
                       color="red", zorder=5, label="chosen (cheapest meeting all targets)")
    for label, tokens_per_user in tpot_targets:
        ax.axvline(tokens_per_user, linestyle="--", color="grey", linewidth=1)
        ax.text(tokens_per_user, ax.get_ylim()[1], f" {label}", va="top", fontsize=8, color="grey")
    ax.set_xlabel("output tokens/s per user (1 / TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    _save(fig, path)
    plt.close(fig)
