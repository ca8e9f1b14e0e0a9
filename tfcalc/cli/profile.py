"""``tfcalc profile``: run the bundled decoder here and measure it beside the calculator's prediction.

Every usage error is found before anything is measured (``check_before_work`` checks the output files against
each other and the inputs). During the sweep, rows are kept whatever happens: an out-of-memory is an ``oom`` row;
the first Ctrl-C lets the current row finish, then stops; a second Ctrl-C, or SIGTERM (``tfcalc.errors.Terminated``
from the entry point's handler), stops at once. The rows so far are written and the run ends with
``tfcalc.errors.Interrupted`` (exit 130 or 143). With ``--output`` naming a regular file, the file is rewritten
(atomically) after every row, and a run that measured nothing leaves an existing file as it was
(docs/reliability.md, section 7).

``--tp N`` / ``--ep N`` shard the model over ranks (``tfcalc.profile.distributed``): spawned here, one per GPU
(``--gpu`` picks them) or CPU processes with gloo, or, under torchrun, this process is one rank and only rank 0
writes. The same promises hold: rows rank 0 measured are kept when a rank fails (one line naming it, exit 1), on
Ctrl-C (every rank stops after the same point) and on SIGTERM.
"""

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from tfcalc.cli.common import (
    ConfigOpt,
    FormatOpt,
    OutputOpt,
    PresetOpt,
    choice,
    file_path,
    handle_errors,
    read_calibration,
    resolve_models,
)
from tfcalc.errors import (
    Interrupted,
    Terminated,
    TfcalcError,
    UsageError,
    missing_matplotlib_message,
    missing_torch_message,
)
from tfcalc.output import Column, emit, pick, print_stderr, varies, wide
from tfcalc.units import parse_sizes, split_list

COLUMNS = pick(
    varies("device"), "model", "layers_run", "layers_total", "batch", "prompt_len", "gen_len",
    varies("dtype", "weights_dtype", "attn_backend"), "ttft_s", wide("prefill_tokens_per_s"), "tpot_s",
    "decode_tokens_per_s", wide("mfu_datasheet", "mfu_measured", "achieved_bytes_per_s"), "mbu_datasheet",
    "mbu_measured",
    wide("predicted_decode_tokens_per_s"), "measured_over_predicted", "status",
    wide("predicted_ttft_s", "predicted_tpot_s", "peak_memory_bytes", "predicted_memory_bytes", "prediction_basis"),
)
SHARDED = pick("tp", "ep", "decode_comm_s", wide("predicted_decode_comm_s"))  # when a row ran on several ranks
GPU_DEFAULT = ("llama3-8b", {})
CPU_DEFAULT = ("llama3.2-1b", {"layers": 2})
CONTEXT_START = {"cpu": 64, "cuda": 256}  # first prompt length of --context auto
NOTES = (
    "TTFT = prefill of the batch's prompts; TPOT = decode time / (gen - 1) steps, timed apart from prefill; medians "
    "after warm-up. bandwidth = decode bytes per step (weights read, experts actually touched, the KV cache the "
    "step reads, logits) / TPOT; decode reads the live cache (decode_attention live: sliced, eager; flex: live "
    "blocks, compiled) or the whole static one (static). MBU against the datasheet and against the copy "
    "bandwidth measured in this run; MFU = prefill FLOPs / TTFT against the datasheet and the measured matmul "
    "peak. Empty columns are left out; --wide shows the rest. "
    "Bandwidth in decimal units (GB/s = 10^9 B/s).",
)

Overrides = Annotated[int | None, typer.Option(show_default=False)]


def _require_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        raise TfcalcError(missing_torch_message())


def _items(values: list[str] | None, what: str) -> list[str]:
    return [item for value in values or [] for item in split_list(value, what)]


def _check_choices(values: list[str], known: tuple[str, ...], what: str) -> None:
    for value in values:
        if value not in known:
            raise UsageError(f"unknown {what} '{value}' (choose {', '.join(known)})")


@handle_errors
def profile(
    preset: PresetOpt = None, config: ConfigOpt = None,
    gpu: Annotated[str | None, typer.Option(help="GPU index, list (0,1) or all; default 0.", show_default=False)]
    = None,
    device: Annotated[str, typer.Option(help="cuda or cpu.", parser=choice)] = "cuda",
    batch: Annotated[list[str], typer.Option(help="Batch sizes (list: 1,8,64).")] = ["1"],  # noqa: B006
    prompt_len: Annotated[list[str] | None, typer.Option(
        help="Prompt lengths (default 512 on a GPU, 128 on the CPU).", show_default=False)] = None,
    context: Annotated[list[str] | None, typer.Option(
        help="Sweep the context instead of --prompt-len: 'auto' doubles the prompt from 256 (64 on the CPU) up "
        "to the model's max context that fits in memory; or a list (1k,8k,32k).", show_default=False)] = None,
    gen_len: Annotated[list[str] | None, typer.Option(
        help="Generated tokens per sequence, >= 2 (default 128 on a GPU, 16 on the CPU).", show_default=False)]
    = None,
    dtype: Annotated[list[str], typer.Option(help="Compute dtype: bf16, fp16, fp32; lists sweep.", parser=choice)]
    = ["bf16"],  # noqa: B006
    weights_dtype: Annotated[list[str] | None, typer.Option(
        help="FP8 weights: fp8 (one scale per matrix) or fp8_block (128x128 block scales); default: the compute "
        "dtype.", show_default=False, parser=choice)] = None,
    attn_backend: Annotated[list[str], typer.Option(
        help="SDPA backend(s): auto, flash, efficient, cudnn, math.", parser=choice)] = ["auto"],  # noqa: B006
    decode_attention: Annotated[str, typer.Option(
        help="How decode reads the cache: auto (flex over the live blocks when compiled, else live), live, flex, "
        "static (the whole cache).", parser=choice)] = "auto",
    layers: Overrides = None, hidden: Overrides = None, intermediate: Overrides = None, vocab: Overrides = None,
    experts: Overrides = None,
    tp: Annotated[int, typer.Option(
        "--tp", help="Tensor-parallel ranks: the model sharded Megatron-style over N GPUs (or CPU processes), "
        "spawned here or run under torchrun.")] = 1,
    ep: Annotated[int, typer.Option(
        "--ep", help="Expert-parallel ranks for MoE models: experts placed E/ep per rank (ep > tp: ep/tp "
        "attention replicas, tokens by all-to-all).")] = 1,
    compile_decode: Annotated[bool, typer.Option(
        "--compile/--no-compile", help="Capture decode with torch.compile(mode='reduce-overhead') on CUDA.")] = True,
    warmup: Annotated[int, typer.Option(help="Untimed runs before timing.")] = 2,
    repeats: Annotated[int, typer.Option(help="Timed runs; the median is reported.")] = 5,
    calibration: Annotated[Path | None, typer.Option(
        help="Efficiencies for the predicted column (a calibration or profile JSON).", show_default=False,
        parser=file_path)] = None,
    save_calibration: Annotated[Path | None, typer.Option(
        help="Write the measured efficiencies here for 'tfcalc estimate --calibration'.", show_default=False,
        parser=file_path)] = None,
    plot: Annotated[Path | None, typer.Option(
        help="Write a PNG of time per token vs context, measured beside predicted.", show_default=False,
        parser=file_path)] = None,
    fmt: FormatOpt = None, output: OutputOpt = None,
) -> None:
    """Measure prefill and decode of the bundled decoder (random weights) on this GPU or CPU, with FLOP/s,
    bandwidth, MFU/MBU against datasheet and measured ceilings, and the calculator's prediction beside them."""
    _require_torch()
    from tfcalc.profile import sweep as profiler
    from tfcalc.profile.device import DTYPES, available_memory_bytes, select_devices, select_rank_devices

    # --- every usage error before anything is measured --------------------------------------------------------
    if warmup < 0 or repeats < 1:
        raise UsageError("--warmup must be >= 0 and --repeats >= 1")
    if tp < 1 or ep < 1:
        raise UsageError("--tp and --ep must be at least 1")
    from tfcalc.profile.distributed import torchrun_rank

    world = profiler.world_size(tp, ep)
    under_torchrun = torchrun_rank()
    if under_torchrun is not None and under_torchrun.world > 1 and under_torchrun.world != world:
        raise UsageError(f"torchrun started {under_torchrun.world} ranks but --tp {tp} --ep {ep} needs {world}")
    if world > 1 and under_torchrun is None:
        devices = select_rank_devices(gpu, device, world)
    else:  # one device, or this torchrun rank's (cuda:LOCAL_RANK)
        devices = select_devices(None if under_torchrun is not None and world > 1 else gpu, device)
    on_cpu = devices[0].type == "cpu"
    dtypes = _items(dtype, "--dtype")
    for d in dtypes:
        if d not in DTYPES:
            raise UsageError(f"unknown profile dtype '{d}' (choose {', '.join(DTYPES)}; FP8 weights: "
                             "--weights-dtype fp8 or fp8_block)")
    weights = _items(weights_dtype, "--weights-dtype")
    _check_choices(weights, profiler.WEIGHTS_DTYPES, "--weights-dtype")
    backends = _items(attn_backend, "--attn-backend")
    _check_choices(backends, profiler.ATTENTION_BACKENDS, "attention backend")
    _check_choices([decode_attention], profiler.DECODE_ATTENTION, "--decode-attention")
    gens = parse_sizes(gen_len or ["16" if on_cpu else "128"], "gen-len")
    if min(gens) < 2:
        raise UsageError("--gen-len must be at least 2 (the first token comes from prefill)")
    if context and prompt_len:
        raise UsageError("--context sweeps the prompt length: give it or --prompt-len, not both")
    auto_context = [c.lower() for c in _items(context, "context")] == ["auto"]
    prompts = [] if auto_context else parse_sizes(
        (context if context else prompt_len) or ["128" if on_cpu else "512"], "context" if context else "prompt-len")
    if preset or config:
        models, defaults = resolve_models(preset, config), {}
    else:
        name, defaults = CPU_DEFAULT if on_cpu else GPU_DEFAULT
        models = resolve_models([name], None)
    overrides = {k: v for k, v in {"layers": layers, "hidden": hidden, "intermediate": intermediate,
                                   "vocab": vocab, "experts": experts}.items() if v is not None}
    loaded = read_calibration(calibration) if calibration else None
    sweeps = []
    for spec in models:
        sizes = {**defaults, **overrides}
        run_spec = profiler.scale_spec(spec, **sizes)  # refuses --vocab 1, --layers above the model's, ...
        note = ""
        if "layers" in sizes:
            note = profiler.describe_layers(spec, profiler.pick_layers(spec, int(sizes["layers"])))
        sweep = profiler.Sweep(
            spec=run_spec, layers_total=run_spec.num_layers if sizes else spec.num_layers, layers_explicit=bool(sizes),
            batches=parse_sizes(batch, "batch"), prompt_lens=prompts, gen_lens=gens, dtypes=dtypes, backends=backends,
            compile_decode=compile_decode and not on_cpu, warmup=warmup, repeats=repeats, calibration=loaded,
            weights_dtypes=list(weights) or [None], decode_attention=decode_attention, layer_note=note)
        if auto_context:
            lengths = profiler.contexts_that_fit(run_spec, sweep, available_memory_bytes(devices[0]),
                                              CONTEXT_START[devices[0].type])
            if not lengths:
                raise UsageError(f"--context auto: no prompt of {CONTEXT_START[devices[0].type]} tokens or more "
                                 f"fits {run_spec.name} in this device's memory")
            sweep = replace(sweep, prompt_lens=lengths)
        if world > 1:
            profiler.check_sharding(run_spec, tp, ep)
            for w in weights:  # block-scaled slices off 128-element blocks, refused before any rank starts
                profiler.check_fp8_sharding(run_spec, tp, ep, w)
            dp = world // tp
            uneven = [b for b in sweep.batches if b % dp]
            if uneven:
                raise UsageError(f"--batch {uneven[0]} does not split over the {dp} attention replicas of tp {tp} "
                                 f"x ep {ep} (the batch counts every replica's sequences)")
            sweep = replace(sweep, compile_decode=False)  # collectives are timed from the host: decode runs eagerly
        sweeps.append(sweep)
    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(missing_matplotlib_message())

    # --- the sweep: rows kept through OOM and signals ---------------------------------------------------------
    rows: list[dict[str, object]] = []
    from tfcalc.output.files import replaces_a_file

    checkpoint = output is not None and replaces_a_file(output)

    def keep(row: dict[str, object]) -> None:
        rows.append(row)
        if checkpoint:  # the file holds every row measured so far; a stream (-, a FIFO) is written once, at the end
            emit(rows, _columns(rows), fmt, output, title="Profile", notes=_notes(rows), announce=False)

    stop = profiler.StopRequested()
    stopped: BaseException | None = None
    failed: TfcalcError | None = None
    with stop.installed():
        try:
            if world > 1:
                if not _run_ranks(profiler.ParallelProfile(tuple(sweeps), tp, ep), sweeps, devices, world, keep,
                                  stop):
                    stopped = KeyboardInterrupt()
            else:
                for sweep in sweeps:
                    if not _run_with_progress(sweep, devices, keep, stop):
                        stopped = KeyboardInterrupt()
                        break
        except KeyboardInterrupt as exc:  # a second Ctrl-C, or SIGTERM (tfcalc.errors.Terminated)
            stopped = exc
        except TfcalcError as exc:  # a rank failed: the rows rank 0 measured before are kept, then the error
            failed = exc
    if under_torchrun is not None and under_torchrun.rank != 0:
        if failed is not None:
            raise failed
        if stopped is not None:
            raise Interrupted.from_exception(stopped, "rank 0 keeps the rows")
        return  # rank 0 writes the rows

    # --- what was measured -------------------------------------------------------------------------------------
    if rows:
        emit(rows, _columns(rows), fmt, output, title="Profile", notes=_notes(rows))
    elif output is not None and Path(output).is_file():
        print_stderr(f"kept {output} as it was: no row was measured")
    if save_calibration is not None and any(str(r.get("status", "")).startswith("ok") for r in rows):
        from tfcalc.output.files import write_atomic
        from tfcalc.profile.efficiency import efficiency_from_rows

        write_atomic(save_calibration, json.dumps(efficiency_from_rows(rows), indent=2) + "\n")
        print_stderr(f"wrote calibration to {save_calibration}")
    elif save_calibration is not None:
        print_stderr(f"no calibration written to {save_calibration}: no row was measured")
    if plot is not None and any(r.get("tpot_s") is not None for r in rows):
        from tfcalc.output.plot import plot_profile

        plot_profile(plot, rows)
        print_stderr(f"wrote plot to {plot}")
    if failed is not None:
        kept = f" (kept {len(rows)} row{'' if len(rows) == 1 else 's'} measured before)" if rows else ""
        raise type(failed)(f"{failed}{kept}")
    if stopped is not None:
        reason = "SIGTERM" if isinstance(stopped, Terminated) else "Ctrl-C"
        raise Interrupted.from_exception(stopped, f"kept {len(rows)} row{'' if len(rows) == 1 else 's'} measured "
                                                  f"before {reason}")


def _run_ranks(job, sweeps, devices, world: int, on_row, stop) -> bool:  # noqa: ANN001 - lazily imported types
    """Run the sharded sweeps on ``world`` ranks (spawned, or this process under torchrun), one line per row on
    stderr. False when a Ctrl-C stopped them after a point."""
    from tfcalc.profile.distributed import launch, run_under_torchrun, torchrun_rank

    total = sum(len(s.points()) for s in sweeps)
    where = torchrun_rank()
    device_type = devices[0].type
    names = ", ".join(dict.fromkeys(s.spec.name for s in sweeps))
    backend = "nccl" if device_type == "cuda" else "gloo"
    if where is None or where.rank == 0:
        print_stderr(f"profiling {names}: {total} points on {world} ranks ({backend}"
                     f"{', torchrun' if where is not None else ''})")
    done = iter(range(1, total + 1))

    def on_message(kind: str, payload: object) -> None:
        if kind == "row" and isinstance(payload, dict):
            on_row(payload)
            print_stderr(f"  {next(done, total)}/{total} {payload['model']} {payload['dtype']} tp {payload['tp']} "
                         f"ep {payload['ep']} batch {payload['batch']} prompt {payload['prompt_len']}: "
                         f"{payload['status']}")

    if where is not None:
        run_under_torchrun(job, where, device_type, on_message, lambda: stop.requested)
    else:
        launch(job, world, device_type, on_message, devices=[d.index for d in devices] if device_type == "cuda"
               else None, stop_requested=lambda: stop.requested)
    return not stop.requested


def _columns(rows: list[dict[str, object]]) -> list[Column]:
    """The table's columns: the sharding ones (before the status) only when some row ran on several ranks."""
    if any((r.get("world_size") or 1) > 1 for r in rows):  # type: ignore[operator]
        at = [c.key for c in COLUMNS].index("status")
        return [*COLUMNS[:at], *SHARDED, *COLUMNS[at:]]
    return COLUMNS


def _notes(rows: list[dict[str, object]]) -> tuple[str, ...]:
    devices = (f"{r['device']}: {r['device_note']}" for r in rows if r.get("device_note"))
    layers = (f"{r['model']}: ran {r['layer_pattern']}" for r in rows if r.get("layer_pattern"))
    return NOTES + tuple(dict.fromkeys(devices)) + tuple(dict.fromkeys(layers))


def _run_with_progress(sweep, devices, on_row, stop) -> bool:  # noqa: ANN001 - lazily imported types
    """Run one sweep; a progress bar on a terminal, else one line per row on stderr (CI logs, pipes). False when
    the first Ctrl-C stopped it after a row."""
    from tfcalc.profile.sweep import run_sweep

    total = len(sweep.points()) * len(devices)
    try:
        terminal = sys.stderr is not None and sys.stderr.isatty()
    except (OSError, ValueError):
        terminal = False
    if terminal:
        return _with_bar(sweep, devices, on_row, stop, total, run_sweep)
    print_stderr(f"profiling {sweep.spec.name}: {total} points on {', '.join(map(str, devices))}")
    done = iter(range(1, total + 1))
    return run_sweep(sweep, devices, on_row, stop,
                     advance=lambda label: print_stderr(f"  {next(done)}/{total} {label}"),
                     on_build=lambda what: print_stderr(f"  {what}"))


def _with_bar(sweep, devices, on_row, stop, total: int, run_sweep) -> bool:  # noqa: ANN001
    """A Rich progress bar on stderr. Labels hold model names from files: made printable, their markup escaped
    (a model named '[/]' is text); after a first Ctrl-C the bar says it stops after the current row."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tfcalc.output.terminal import printable

    class StopNotice(TextColumn):
        def render(self, task):  # noqa: ANN001, ANN202 - Rich's column interface
            self.text_format = "Ctrl-C: stopping after this row (again: now)" if stop.requested else ""
            return super().render(task)

    def label(text: str) -> str:
        return escape(printable(text, one_line=True))

    progress = Progress(TextColumn("profiling {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), StopNotice(""), console=Console(stderr=True), transient=True)
    with progress:
        task = progress.add_task(label(sweep.spec.name), total=total)
        return run_sweep(sweep, devices, on_row, stop,
                         advance=lambda text: progress.update(task, advance=1, description=label(text)),
                         on_build=lambda text: progress.update(task, description=label(text)))
