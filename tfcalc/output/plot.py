"""PNG charts for ``plan --plot`` and ``estimate --plot``. matplotlib (the ``plot`` extra) is imported only here,
inside the functions, with the non-interactive Agg backend; files are written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfcalc.errors import UsageError, missing_matplotlib_message

GIB = 1 << 30


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError(missing_matplotlib_message()) from None
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


def plot_plan(path: Path, title: str, series: list[tuple[str, list[int], list[int]]],
              capacities: list[tuple[str, int]]) -> None:
    """Memory per GPU against context: one line per (label, contexts, bytes) series, each GPU's capacity
    (name, bytes) as a horizontal line; bytes drawn in GiB (``tfcalc.report.plan.memory_by_context``)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, contexts, values in series:
        ax.plot(contexts, [v / GIB for v in values], marker=".", label=label)
    first_context = min(c for _, contexts, _ in series for c in contexts)
    for name, capacity in capacities:
        ax.axhline(capacity / GIB, linestyle="--", color="black", linewidth=1)
        ax.text(first_context, capacity / GIB, f" {name} capacity {capacity / GIB:.0f} GiB", va="bottom", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("memory per GPU (GiB): weights + reserved + KV")
    ax.set_title(title)
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
