"""``tfcalc profile``: run the bundled decoder here and measure it beside the calculator's prediction."""

import importlib.util
import json
from pathlib import Path
from typing import Annotated

import typer

from tfcalc.cli.common import ConfigOpt, FormatOpt, OutputOpt, PresetOpt, handle_errors, resolve_models
from tfcalc.errors import TfcalcError, UsageError
from tfcalc.output import Column, emit, print_stderr
from tfcalc.units import parse_sizes, split_list

COLUMNS = [
    Column("device", "device"),
    Column("model", "model"),
    Column("layers_run", "layers", "int"),
    Column("layers_total", "of", "int"),
    Column("batch", "batch", "int"),
    Column("prompt_len", "prompt", "int"),
    Column("gen_len", "gen", "int"),
    Column("dtype", "dtype"),
    Column("attn_backend", "attention"),
    Column("ttft_s", "TTFT", "seconds"),
    Column("prefill_tokens_per_s", "prefill", "rate", "tok/s"),
    Column("tpot_s", "TPOT", "seconds"),
    Column("decode_tokens_per_s", "decode", "rate", "tok/s"),
    Column("mfu", "MFU", "percent"),
    Column("mfu_measured", "MFU (measured peak)", "percent"),
    Column("achieved_bytes_per_s", "bandwidth", "bytes", "/s"),
    Column("mbu_datasheet", "MBU", "percent"),
    Column("mbu_measured", "MBU (measured copy)", "percent"),
    Column("predicted_decode_tokens_per_s", "predicted decode", "rate", "tok/s"),
    Column("measured_over_predicted", "measured / predicted", "float"),
    Column("status", "status"),
]
GPU_DEFAULT = ("llama3-8b", {})
CPU_DEFAULT = ("llama3.2-1b", {"layers": 2})
NOTES = (
    "TTFT = prefill of the batch's prompts; TPOT = decode time / (gen - 1) steps, timed apart from prefill; medians "
    "after warm-up. bandwidth = decode bytes per step (weights read, experts actually touched, whole static KV "
    "cache, logits) / TPOT; MBU against the datasheet and against the copy bandwidth measured in this run; MFU = "
    "prefill FLOPs / TTFT against the datasheet and the measured matmul peak. Empty columns are left out. "
    "Bandwidth in binary units per second.",
)

Overrides = Annotated[int | None, typer.Option(show_default=False)]


def _require_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        raise TfcalcError("the profiler needs PyTorch: pip install 'tfcalc[profile]'")


@handle_errors
def profile(
    preset: PresetOpt = None, config: ConfigOpt = None,
    gpu: Annotated[str | None, typer.Option(help="GPU index, list (0,1) or all; default 0.", show_default=False)]
    = None,
    device: Annotated[str, typer.Option(help="cuda or cpu.")] = "cuda",
    batch: Annotated[list[str], typer.Option(help="Batch sizes (list: 1,8,64).")] = ["1"],  # noqa: B006
    prompt_len: Annotated[list[str] | None, typer.Option(
        help="Prompt lengths (default 512 on a GPU, 128 on the CPU).", show_default=False)] = None,
    gen_len: Annotated[list[str] | None, typer.Option(
        help="Generated tokens per sequence, >= 2 (default 128 on a GPU, 16 on the CPU).", show_default=False)]
    = None,
    dtype: Annotated[list[str], typer.Option(help="bf16, fp16, fp32; lists sweep.")] = ["bf16"],  # noqa: B006
    attn_backend: Annotated[list[str], typer.Option(
        help="SDPA backend(s): auto, flash, efficient, cudnn, math.")] = ["auto"],  # noqa: B006
    layers: Overrides = None, hidden: Overrides = None, intermediate: Overrides = None, vocab: Overrides = None,
    experts: Overrides = None,
    compile_decode: Annotated[bool, typer.Option(
        "--compile/--no-compile", help="Capture decode with torch.compile(mode='reduce-overhead') on CUDA.")] = True,
    warmup: Annotated[int, typer.Option(help="Untimed runs before timing.")] = 2,
    repeats: Annotated[int, typer.Option(help="Timed runs; the median is reported.")] = 5,
    calibration: Annotated[Path | None, typer.Option(
        help="Efficiencies for the predicted column (a calibration or profile JSON).", show_default=False)] = None,
    save_calibration: Annotated[Path | None, typer.Option(
        help="Write the measured efficiencies here for 'tfcalc estimate --calibration'.", show_default=False)]
    = None,
    fmt: FormatOpt = None, output: OutputOpt = None,
) -> None:
    """Measure prefill and decode of the bundled decoder (random weights) on this GPU or CPU, with FLOP/s,
    bandwidth, MFU/MBU against datasheet and measured ceilings, and the calculator's prediction beside them."""
    _require_torch()
    from tfcalc.calc.roofline import calibration_from_profile_rows
    from tfcalc.model.transformer import scale_spec
    from tfcalc.profile.bench import StopRequested, Sweep
    from tfcalc.profile.device import select_devices
    from tfcalc.profile.measure import DTYPES

    if warmup < 0 or repeats < 1:
        raise UsageError("--warmup must be >= 0 and --repeats >= 1")
    on_cpu = device == "cpu"
    if preset or config:
        spec, defaults = resolve_models(preset, config)[0], {}
    else:
        name, defaults = CPU_DEFAULT if on_cpu else GPU_DEFAULT
        spec = resolve_models([name], None)[0]
    overrides = {k: v for k, v in {"layers": layers, "hidden": hidden, "intermediate": intermediate,
                                   "vocab": vocab, "experts": experts}.items() if v is not None}
    for key, value in overrides.items():
        if value <= 0:
            raise UsageError(f"invalid --{key} {value}: must be positive")
    run_spec = scale_spec(spec, **{**defaults, **overrides})
    dtypes = [d for value in dtype for d in split_list(value)]
    for d in dtypes:
        if d not in DTYPES:
            raise UsageError(f"unknown profile dtype '{d}' (choose {', '.join(DTYPES)})")
    gens = parse_sizes(gen_len or ["16" if on_cpu else "128"], "gen-len")
    if min(gens) < 2:
        raise UsageError("--gen-len must be at least 2 (the first token comes from prefill)")
    sweep = Sweep(
        spec=run_spec, layers_total=run_spec.num_layers if (overrides or defaults) else spec.num_layers,
        layers_explicit=bool(overrides or defaults), batches=parse_sizes(batch, "batch"),
        prompt_lens=parse_sizes(prompt_len or ["128" if on_cpu else "512"], "prompt-len"), gen_lens=gens,
        dtypes=dtypes, backends=[b for value in attn_backend for b in split_list(value)],
        compile_decode=compile_decode and not on_cpu, warmup=warmup, repeats=repeats,
        efficiency=_load_efficiency(calibration) if calibration else None)
    devices = select_devices(gpu, device)
    rows: list[dict[str, object]] = []
    stop = StopRequested()
    finished = _run_with_progress(sweep, devices, rows, stop)
    device_notes = tuple(dict.fromkeys(f"{r['device']}: {r['device_note']}" for r in rows if r.get("device_note")))
    emit(rows, COLUMNS, fmt, output, title="Profile", notes=NOTES + device_notes)
    if save_calibration is not None:
        from tfcalc.output.files import write_atomic

        write_atomic(save_calibration, json.dumps(calibration_from_profile_rows(rows), indent=2) + "\n")
        print_stderr(f"wrote calibration to {save_calibration}")
    if not finished:
        raise TfcalcError(f"interrupted: kept the {len(rows)} rows measured before Ctrl-C")


def _run_with_progress(sweep, devices, rows: list, stop) -> bool:  # noqa: ANN001 - lazily imported types
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tfcalc.profile.bench import run_sweep

    total = len(sweep.points()) * len(devices)
    progress = Progress(TextColumn("profiling {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    with progress, stop.installed():
        task = progress.add_task("", total=total)
        try:
            return run_sweep(sweep, devices, rows.append, stop,
                             advance=lambda label: progress.update(task, advance=1, description=label))
        except KeyboardInterrupt:
            return False


def _load_efficiency(path: Path):  # noqa: ANN202 - tfcalc.calc.roofline.Efficiency
    from tfcalc.calc.roofline import load_calibration
    from tfcalc.spec.presets import read_data_file

    return load_calibration(read_data_file(path, allow_list=True), str(path))
