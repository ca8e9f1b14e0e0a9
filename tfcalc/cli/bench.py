"""``tfcalc bench attention | moe | ceilings | calibrate | collectives``: component benchmarks, each its own table,
and the measurements ``tfcalc estimate --calibration`` reads.

torch is imported only inside the commands (through ``tfcalc.profile``), so ``tfcalc --help`` and the
calculator commands stay light.
"""

import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer

from tfcalc.cli.common import FormatOpt, OutputOpt, choice, file_path, handle_errors
from tfcalc.errors import TfcalcError, UsageError, missing_torch_message
from tfcalc.output import emit, pick, show_progress, varies, wide
from tfcalc.units import format_si, parse_size, parse_sizes, split_list

app = typer.Typer(help="Component benchmarks: SDPA attention backends, MoE vs dense FFN, copy and matmul ceilings, "
                  "collectives over ranks, and a calibration file for 'tfcalc estimate'.",
                  no_args_is_help=True)


DeviceOpt = Annotated[str, typer.Option(
    "--device", help="cuda | cpu. Default cuda; without a visible GPU pass --device cpu.", parser=choice)]
GpuOpt = Annotated[str | None, typer.Option(
    "--gpu", "-g", help="GPU index (0), list (0,1) or all; default 0.", show_default=False)]
DtypeOpt = Annotated[list[str] | None, typer.Option(
    "--dtype", help="bf16 | fp16 | fp32, lists allowed; default bf16 on a GPU, fp32 on the CPU.", show_default=False,
    parser=choice)]
WarmupOpt = Annotated[int, typer.Option("--warmup", help="Untimed calls before timing.", min=0)]
RepeatsOpt = Annotated[int, typer.Option("--repeats", help="Timed calls; the median is reported.", min=1)]


class TorchMissing(TfcalcError):
    exit_code = 1


def profile_modules(name: str) -> tuple[ModuleType, ModuleType]:
    """(``tfcalc.profile.NAME``, the benchmark of ``tfcalc bench NAME``; ``tfcalc.profile.device``), or one clear
    line when torch is not installed."""
    import importlib

    try:
        return importlib.import_module(f"tfcalc.profile.{name}"), importlib.import_module("tfcalc.profile.device")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "torch":
            raise TorchMissing(missing_torch_message()) from None
        raise


def dtype_names(values: list[str] | None, default: str) -> list[str]:
    names = [item for value in values or [default] for item in split_list(value)]
    return list(dict.fromkeys(names))


def progress_printer() -> Callable[[str], None] | None:
    """A one-line status on stderr while measuring (``tfcalc.output.show_progress``), only on a terminal."""
    try:
        terminal = sys.stderr is not None and sys.stderr.isatty()
    except (OSError, ValueError):
        terminal = False
    return show_progress if terminal else None


def clear_progress(show: Callable[[str], None] | None) -> None:
    if show is not None:
        show("")


# --- attention -------------------------------------------------------------------------------------------------

ATTENTION_COLUMNS = pick(
    varies("device"), "backend", "backend_ran", varies("dtype", "batch"), "heads", "kv_heads", "head_dim", "seq_len",
    "phase", "time_s", "flops_per_s", "bytes_per_s", "flops_fraction_of_peak", "bandwidth_fraction_of_peak", "status",
)

CPU_ATTENTION = {"seq_len": ["128,512"], "heads": 8, "kv_heads": ["8,2"], "head_dim": 64, "decode_batch": 4}
GPU_ATTENTION = {"seq_len": ["1k,4k,16k"], "heads": 32, "kv_heads": ["32,8,1"], "head_dim": 128, "decode_batch": 16}


@app.command("attention")
@handle_errors
def attention(
    device: DeviceOpt = "cuda", gpu: GpuOpt = None, dtype: DtypeOpt = None,
    backend: Annotated[list[str] | None, typer.Option(
        "--backend", help="auto, flash, efficient, cudnn, math (lists allowed); default all. Backends that "
        "cannot run here are listed as unavailable.", show_default=False)] = None,
    seq_len: Annotated[list[str] | None, typer.Option(
        "--seq-len", "-t", help="Sequence lengths (1k = 1024); default 128,512 on the CPU, 1k,4k,16k on a GPU.",
        show_default=False)] = None,
    heads: Annotated[int | None, typer.Option(
        "--heads", help="Query heads H; default 8 on the CPU, 32 on a GPU.", show_default=False)] = None,
    kv_heads: Annotated[list[str] | None, typer.Option(
        "--kv-heads", help="KV heads (GQA ratios H/Hkv), lists; default 8,2 on the CPU, 32,8,1 on a GPU.",
        show_default=False)] = None,
    head_dim: Annotated[int | None, typer.Option(
        "--head-dim", help="Head dim D; default 64 on the CPU, 128 on a GPU.", show_default=False)] = None,
    batch: Annotated[int, typer.Option("--batch", "-b", help="Batch for prefill.", min=1)] = 1,
    decode_batch: Annotated[int | None, typer.Option(
        "--decode-batch", help="Batch for the decode case (1 query vs T keys); default 4 on the CPU, 16 on a GPU "
        "(so K+V exceed the GPU's L2).", min=1, show_default=False)] = None,
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="Causal prefill (FLOPs halved).")] = True,
    decode: Annotated[bool, typer.Option("--decode/--no-decode", help="Also time the decode case.")] = True,
    peak_tflops: Annotated[float | None, typer.Option(
        "--peak-tflops", help="Peak TFLOP/s to report the fraction of; default: the matched GPU preset's "
        "datasheet dense figure for the dtype (none on a CPU).", show_default=False)] = None,
    warmup: WarmupOpt = 2, repeats: RepeatsOpt = 5, fmt: FormatOpt = None, output: OutputOpt = None,
) -> None:
    """F.scaled_dot_product_attention per backend x sequence length x GQA ratio: time, TFLOP/s, KV bytes/s."""
    comp, dev = profile_modules("attention")
    devices = dev.select_devices(gpu, device)
    defaults = CPU_ATTENTION if devices[0].type == "cpu" else GPU_ATTENTION
    backends = [b for value in backend or [",".join(comp.ATTENTION_BACKENDS)] for b in split_list(value)]
    for b in backends:
        if b not in comp.ATTENTION_BACKENDS:
            raise UsageError(f"unknown attention backend '{b}' (known: {', '.join(comp.ATTENTION_BACKENDS)})")
    backends = list(dict.fromkeys(backends))
    seq_lens = parse_sizes(seq_len or defaults["seq_len"], "sequence length")
    kv_list = parse_sizes(kv_heads or defaults["kv_heads"], "kv heads")
    h = heads if heads is not None else defaults["heads"]
    d = head_dim if head_dim is not None else defaults["head_dim"]
    if h <= 0 or d <= 0:
        raise UsageError("--heads and --head-dim must be positive")
    if peak_tflops is not None and not 0 < peak_tflops < 1e9:
        raise UsageError(f"--peak-tflops must be a positive number, got {peak_tflops}")
    kv_list = kv_list if kv_heads else [kv for kv in kv_list if kv <= h and h % kv == 0] or [h]
    names = dtype_names(dtype, "fp32" if devices[0].type == "cpu" else "bf16")
    longest, widest = max(seq_lens), max(kv_list)
    for torch_device in devices:  # the largest case's q, k, v, output and (SDPA's math backend) fp32 scores
        element = max(dev.torch_dtype(name).itemsize for name in names)
        tensors = max(batch, decode_batch or defaults["decode_batch"]) * longest * (2 * h + 2 * widest) * d * element
        scores = batch * h * longest * longest * 4 if "math" in backends else 0
        dev.check_fits(torch_device, tensors + scores, f"attention at sequence length {longest:,}",
                       "lower --seq-len, --heads, --head-dim or --batch")
    show = progress_printer()
    rows: list[dict] = []
    peaks_used: list[str] = []
    for torch_device in devices:
        for name in names:
            tdtype = dev.torch_dtype(name)
            peak_flops, peak_bw, preset = dev.datasheet_peaks(torch_device, tdtype)
            if peak_tflops is not None:
                peak_flops, preset = peak_tflops * 1e12, "--peak-tflops"
            if preset:
                peaks_used.append(f"{torch_device} {name}: peaks from {preset}")
            rows += comp.attention_rows(torch_device, tdtype, backends, seq_lens, h, kv_list, d, batch, causal=causal,
                                        decode=decode, decode_batch=decode_batch or defaults["decode_batch"],
                                        peak_flops_per_s=peak_flops, peak_bytes_per_s=peak_bw, warmup=warmup,
                                        repeats=repeats, progress=show)
    clear_progress(show)
    unavailable = sorted({f"{r['backend']} ({r['note']})" for r in rows if r["status"] == "unavailable"})
    notes = (comp.CAUSAL_CONVENTION + ".",
             "prefill: q [B,H,T,D], k/v [B,Hkv,T,D], is_causal, enable_gqa; decode: q [B,H,1,D] vs k/v [B,Hkv,T,D]; "
             f"median of {repeats} after {warmup} warm-up calls; 'ran' = the kernel SDPA's dispatcher picks for "
             "'auto'.",
             *(f"unavailable here: {u}" for u in unavailable), *peaks_used)
    emit(rows, ATTENTION_COLUMNS, fmt, output, title="SDPA attention", notes=notes)


# --- moe -------------------------------------------------------------------------------------------------------

MOE_COLUMNS = pick(
    varies("device", "dtype"), "tokens", "moe_time_s", "moe_tokens_per_s", "dense_tokens_per_s", "moe_over_dense",
    wide("max_tokens_per_expert", "mean_tokens_per_expert"), "load_imbalance", "distinct_experts",
    "expected_distinct_experts", "status",
)


@app.command("moe")
@handle_errors
def moe(
    device: DeviceOpt = "cuda", gpu: GpuOpt = None, dtype: DtypeOpt = None,
    preset: Annotated[str, typer.Option(
        "--preset", "-p", help="An MoE model preset (mixtral-8x7b, qwen3-30b-a3b, ...) or YAML file.")]
    = "mixtral-8x7b",
    tokens: Annotated[list[str] | None, typer.Option(
        "--tokens", "-n", help="Tokens per forward, lists; default 1,16,256,1024 on the CPU, 1,16,256,4096 on a GPU.",
        show_default=False)] = None,
    hidden: Annotated[int | None, typer.Option(
        "--hidden", help="Hidden width; default the preset's on a GPU, 512 on the CPU; the expert width scales alike "
        "unless --expert-intermediate is given.",
        show_default=False)] = None,
    experts: Annotated[int | None, typer.Option("--experts", help="Experts E.", show_default=False)] = None,
    experts_per_token: Annotated[int | None, typer.Option(
        "--experts-per-token", help="Experts per token K.", show_default=False)] = None,
    expert_intermediate: Annotated[int | None, typer.Option(
        "--expert-intermediate", help="Expert FFN width.", show_default=False)] = None,
    warmup: WarmupOpt = 2, repeats: RepeatsOpt = 5, fmt: FormatOpt = None, output: OutputOpt = None,
) -> None:
    """The bundled MoE layer vs a dense FFN of width K x I (same active parameters): tokens/s and expert load."""
    from tfcalc.spec.presets import load_model

    comp, dev = profile_modules("moe")
    devices = dev.select_devices(gpu, device)
    base = load_model(preset)
    token_counts = parse_sizes(tokens or (["1,16,256,1024"] if devices[0].type == "cpu" else ["1,16,256,4096"]),
                               "tokens")
    names = dtype_names(dtype, "fp32" if devices[0].type == "cpu" else "bf16")
    show = progress_printer()
    rows: list[dict] = []
    for torch_device in devices:
        spec = comp.moe_bench_spec(base, torch_device, hidden, experts, experts_per_token, expert_intermediate)
        params = comp.moe_layer_params(spec)
        for name in names:
            tdtype = dev.torch_dtype(name)
            element = 4 if name == "fp32" else 2
            dev.check_fits(torch_device, (params["total"] + params["dense"]) * element, f"{spec.name}'s MoE layer",
                            "scale it down with --hidden, --experts or --expert-intermediate")
            rows += comp.moe_rows(torch_device, tdtype, spec, token_counts, warmup=warmup, repeats=repeats,
                                  progress=show)
    clear_progress(show)
    first = rows[0]
    title = (f"MoE layer vs dense FFN: {first['model']}, hidden {first['hidden']}, E {first['experts']}, "
             f"K {first['experts_per_token']}, expert width {first['expert_intermediate']}, dense width "
             f"{first['dense_intermediate']}")
    notes = (f"dense FFN width = K x I + shared = {first.get('dense_intermediate')}: the MoE layer's active expert "
             f"parameters per token ({first.get('moe_active_params'):,} incl. router) vs dense "
             f"{first.get('dense_params'):,}; MoE/dense = MoE tokens/s / dense tokens/s.",
             "expert load from the layer's per-expert counts of (token, expert) pairs on the timed input; expected "
             "distinct = E(1 - (1 - K/E)^N) under uniform routing; random weights and inputs.",
             f"median of {repeats} after {warmup} warm-up calls.")
    emit(rows, MOE_COLUMNS, fmt, output, title=title, notes=notes)


# --- ceilings --------------------------------------------------------------------------------------------------

CEILING_COLUMNS = pick(
    varies("device"), "ceiling", "dtype", "size", wide("size_unit"), "time_s", "bytes_per_s", "flops_per_s", "spread",
    "status",
)


@app.command("ceilings")
@handle_errors
def ceilings(
    device: DeviceOpt = "cuda", gpu: GpuOpt = None,
    dtype: Annotated[list[str] | None, typer.Option(
        "--dtype", help="Matmul dtypes bf16 | fp16 | fp32, lists; default bf16,fp16,fp32 on a GPU, fp32,bf16 on "
        "the CPU.", show_default=False, parser=choice)] = None,
    copy_size: Annotated[str | None, typer.Option(
        "--copy-size", help="Copy buffer in bytes (256m, 1g), far above the last-level cache; default 1 GiB on a "
        "GPU, 256 MiB on the CPU.",
        show_default=False)] = None,
    matmul_size: Annotated[int | None, typer.Option(
        "--matmul-size", help="n of the n x n x n matmul; default 8192 on a GPU; on the CPU the largest power of "
        "two <= 1024 expected to take < 0.1 s a call.", min=16, show_default=False)] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed calls; the median is reported.", min=1)] = 10,
    fmt: FormatOpt = None, output: OutputOpt = None,
) -> None:
    """Copy bandwidth (bytes read + written / s) and matmul FLOP/s per dtype, with their spread."""
    comp, dev = profile_modules("ceilings")
    devices = dev.select_devices(gpu, device)
    names = [item for value in dtype or (["fp32,bf16"] if devices[0].type == "cpu" else ["bf16,fp16,fp32"])
             for item in split_list(value)]
    dtypes = [dev.torch_dtype(name) for name in dict.fromkeys(names)]
    size = parse_size(copy_size, "copy size") if copy_size else None
    rows: list[dict] = []
    for torch_device in devices:
        rows += comp.ceiling_rows(torch_device, dtypes, copy_bytes=size, matmul_n=matmul_size, repeats=repeats)
    notes = ("copy: dst.copy_(src) of a uint8 buffer, rate = 2 x size (read + write) / median time; matmul: "
             "2 n^3 / median time on random inputs. IQR/median = spread of the timed calls (CSV: rates at the "
             "p25/p75 times). Decimal units: GB = 10^9 B.",)
    emit(rows, CEILING_COLUMNS, fmt, output, title="Device ceilings", notes=notes)


# --- calibrate -------------------------------------------------------------------------------------------------

CALIBRATE_COLUMNS = pick("sweep", "shape", "time_s", "flops_per_s", "bytes_per_s", varies("device"))


def _calibration_rows(data: dict) -> list[dict]:
    """The measurements as table rows: what was timed (the shape in words) and its rate, exact in CSV/JSON."""
    rows: list[dict] = []
    device = data["device_name"]
    for r in data["gemm"]:
        flops = 2 * r["m"] * r["n"] * r["k"]
        rows.append({"sweep": f"gemm {r['dtype']}", "shape": f"{r['m']} x {r['n']} x {r['k']}", "time_s": r["seconds"],
                     "flops_per_s": flops / r["seconds"], "device": device,
                     **{k: r[k] for k in ("dtype", "m", "n", "k")}})
    for r in data["memory"]:
        rows.append({"sweep": "copy", "shape": f"{r['bytes']:,} B moved", "time_s": r["seconds"],
                     "bytes_per_s": r["bytes"] / r["seconds"], "device": device, "bytes": r["bytes"]})
    launch = data["launch"]
    for kind in ("graph", "eager"):
        value = launch[f"{kind}_seconds"]
        if value is not None:
            rows.append({"sweep": "launch", "shape": f"tiny kernel, {'CUDA graph' if kind == 'graph' else 'eager'}",
                         "time_s": value, "device": device})
    for r in data["attention"]:
        rows.append({"sweep": f"attention {r['phase']}", "shape": f"B {r['batch']}, H {r['heads']}/{r['kv_heads']}, "
                     f"D {r['head_dim']}, T {r['seq_len']:,}", "time_s": r["seconds"], "device": device,
                     **{k: r[k] for k in ("phase", "batch", "heads", "kv_heads", "head_dim", "seq_len")}})
    return rows


@app.command("calibrate")
@handle_errors
def calibrate(
    device: DeviceOpt = "cuda", gpu: GpuOpt = None,
    save: Annotated[Path | None, typer.Option(
        "--save", help="Write the calibration file here (JSON) for 'tfcalc estimate --calibration'.",
        show_default=False, parser=file_path)] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Small shapes only (seconds, also on a GPU).")] = False,
    fmt: FormatOpt = None, output: OutputOpt = None,
) -> None:
    """Measure what the latency model needs on this device -- the GEMM efficiency curve, copy bandwidth by size, the
    kernel launch floor with and without CUDA graphs, attention by context -- and write a calibration file."""
    import json

    from tfcalc.calc.calibration import load_calibration_v2

    calibrate_module, dev = profile_modules("calibrate")
    default_plan, measure_calibration = calibrate_module.default_plan, calibrate_module.measure_calibration

    devices = dev.select_devices(gpu, device)
    if len(devices) != 1:
        raise UsageError("calibrate one device at a time: pass --gpu INDEX")
    info = dev.describe(devices[0])
    show = progress_printer()
    data = measure_calibration(devices[0], info.name, default_plan(devices[0], quick),
                               progress=(lambda m: show(f"calibrating: {m}")) if show else None)
    clear_progress(show)
    load_calibration_v2(data, "measured calibration")  # what is written must read back
    notes = ["GEMM: F.linear(x [M x K], w [N x K]) on random inputs; copy: bytes moved = read + write; launch: per "
             "tiny kernel, eager and from one CUDA graph; attention: SDPA causal prefill and one-query decode.",
             f"preset to use with it: {info.gpu_preset}" if info.gpu_preset else
             "no GPU preset matches this device: pass the --gpu preset (or YAML) it should refine to 'tfcalc "
             "estimate'"]
    if save is not None:
        from tfcalc.output.files import write_atomic

        data, kept = _merged(save, data, ("collectives",))
        write_atomic(save, json.dumps(data, indent=1) + "\n")
        notes.append(f"wrote {save}{' (kept its collectives section)' if kept else ''}: tfcalc estimate --gpu "
                     f"{info.gpu_preset or 'GPU'} --calibration {save}")
    emit(_calibration_rows(data), CALIBRATE_COLUMNS, fmt, output, title=f"Calibration: {info.name}", notes=tuple(notes))


def _merged(path: Path, data: dict, keep: tuple[str, ...]) -> tuple[dict, list[str]]:
    """``data`` with the ``keep`` sections of the calibration file already at ``path`` (when it is one), so that
    ``bench calibrate`` and ``bench collectives`` can write one file; (data, the sections kept)."""
    from tfcalc.calc.calibration import is_calibration_v2, load_calibration_v2
    from tfcalc.errors import SpecError
    from tfcalc.spec.presets import read_data_file

    if not path.is_file():
        return data, []
    try:
        existing = read_data_file(path)
        load_calibration_v2(existing, str(path))
    except (SpecError, OSError, ValueError):
        return data, []
    if not is_calibration_v2(existing):
        return data, []
    kept = [name for name in keep if existing.get(name)]
    return {**data, **{name: existing[name] for name in kept}}, kept


# --- collectives -----------------------------------------------------------------------------------------------


def _residuals(fit) -> str:  # noqa: ANN001 - tfcalc.calc.comm.LinkFit
    left_out = (f"; {len(fit.excluded)} of {fit.samples} left out as slow outliers (measured over 2x the fit)"
                if fit.excluded else "")
    return f"residuals rms {fit.rms_residual:.1%}, max {fit.max_residual:.1%}{left_out}"


COLLECTIVE_COLUMNS = pick("op", varies("world_size"), "bytes", "time_s", "algbw_bytes_per_s", "busbw_bytes_per_s",
                          "fit_residual", varies("fit_outlier"), "status", wide("fitted_time_s"))
CPU_COLLECTIVES = {"max_size": "4m", "dtype": "fp32", "iters": 5}
GPU_COLLECTIVES = {"max_size": "1g", "dtype": "bf16", "iters": 20}


@app.command("collectives")
@handle_errors
def collectives(
    device: DeviceOpt = "cuda", gpu: GpuOpt = None,
    ranks: Annotated[int | None, typer.Option(
        "--ranks", "-n", help="Ranks to spawn: default every visible GPU, 2 on the CPU; under torchrun its "
        "WORLD_SIZE.", min=2, show_default=False)] = None,
    op: Annotated[list[str] | None, typer.Option(
        "--op", help="all_reduce, all_gather, reduce_scatter, all_to_all (lists allowed); default all.",
        show_default=False)] = None,
    min_size: Annotated[str, typer.Option("--min-size", help="Smallest message (nccl-tests size S).")] = "1k",
    max_size: Annotated[str | None, typer.Option(
        "--max-size", help="Largest message; sizes double from --min-size. Default 1 GiB on GPUs, 4 MiB on the "
        "CPU; capped to what fits in a third of free memory.", show_default=False)] = None,
    dtype: Annotated[str | None, typer.Option(
        "--dtype", help="bf16 | fp16 | fp32; default bf16 on GPUs, fp32 on the CPU.", show_default=False,
        parser=choice)] = None,
    iters: Annotated[int | None, typer.Option(
        "--iters", help="Calls timed back to back per timing; default 20 on GPUs, 5 on the CPU.", min=1,
        show_default=False)] = None,
    warmup: WarmupOpt = 1,
    repeats: Annotated[int, typer.Option("--repeats", help="Timings per size: the median on GPUs, the fastest on "
                                         "the CPU.", min=1)] = 5,
    save: Annotated[Path | None, typer.Option(
        "--save", help="Write the timings to this calibration file (JSON) for 'tfcalc estimate --calibration' "
        "(an existing calibration file keeps its other sections).", show_default=False, parser=file_path)] = None,
    fmt: FormatOpt = None, output: OutputOpt = None,
) -> None:
    """All-reduce, all-gather, reduce-scatter and all-to-all over message sizes on torch.distributed (NCCL on GPUs,
    gloo on the CPU): time, algorithm and bus bandwidth as nccl-tests defines them, and an alpha-beta fit."""
    import json

    from tfcalc.calc.comm import COLLECTIVES

    module, dev = profile_modules("collectives")
    from tfcalc.profile.distributed import launch, run_under_torchrun, torchrun_rank

    where = torchrun_rank()
    defaults = CPU_COLLECTIVES if device == "cpu" else GPU_COLLECTIVES
    ops = [item for value in op or [",".join(COLLECTIVES)] for item in split_list(value)]
    for name in ops:
        if name not in COLLECTIVES:
            raise UsageError(f"unknown collective '{name}' (choose {', '.join(COLLECTIVES)})")
    ops = list(dict.fromkeys(ops))
    names = dtype_names([dtype] if dtype else None, defaults["dtype"])
    if len(names) != 1 or names[0] not in dev.DTYPES:
        raise UsageError(f"--dtype takes one of {', '.join(dev.DTYPES)}")
    smallest, largest = parse_size(min_size, "min size"), parse_size(max_size or defaults["max_size"], "max size")
    if smallest < 1 or largest < smallest:
        raise UsageError("--min-size must be positive and at most --max-size")
    if where is not None:
        if ranks is not None and ranks != where.world:
            raise UsageError(f"--ranks {ranks}: torchrun started {where.world}")
        world, devices = where.world, dev.select_devices(None, device)
    else:
        if device == "cuda" and ranks is None:
            dev.select_devices(gpu, device)  # its one-line error when no GPU is visible
            world = len(gpu.split(",")) if gpu and gpu != "all" else dev.visible_gpus()
        else:
            world = ranks or 2
        if world < 2:
            raise UsageError(f"a collective needs 2 or more ranks; {world} GPU visible (use --device cpu --ranks 2 "
                             "to check the plumbing)")
        devices = dev.select_rank_devices(gpu, device, world)
    job = module.CollectivesJob(ops=tuple(ops), sizes=tuple(module.message_sizes(smallest, largest)),
                                dtype=names[0], iters=iters or defaults["iters"], warmup=warmup, repeats=repeats)
    got: dict = {}
    show = progress_printer()

    def on_message(kind: str, payload: object) -> None:
        if kind == "results":
            got.update(payload)  # type: ignore[arg-type]
        elif kind == "progress" and show is not None:
            show(f"collectives: {payload}")

    if where is not None:
        run_under_torchrun(job, where, device, on_message, lambda: False)
        if where.rank != 0:
            return
    else:
        launch(job, world, device, on_message, devices=[d.index for d in devices] if device == "cuda" else None)
    clear_progress(show)
    results = got["results"]
    fits = module.fits_by_op(results, world)
    rows = module.rows(results, world, got["backend"], got["device"], got["dtype"], fits)
    from tfcalc.calc.comm import fit_link

    kept = "median" if device == "cuda" else "fastest"
    notes = [f"{got['backend']} over {world} ranks, {got['dtype']}: time = {job.iters} calls back to back / "
             f"{job.iters}, averaged over the ranks, {kept} of {repeats} after {warmup} warm-up; size S, algbw = S / "
             "time and busbw = algbw x 2(n-1)/n (all-reduce) or (n-1)/n as nccl-tests defines them "
             "(doc/PERFORMANCE.md). Decimal units: GB = 10^9 B."]
    for name, fit in fits.items():
        factor = "2(n-1)/n" if name == "all_reduce" else "(n-1)/n"
        notes.append(f"{name} fit: latency {fit.latency_s(name, world) * 1e6:,.1f} us + S x {factor} / "
                     f"{format_si(fit.bandwidth_bytes_per_s, 'B/s')}; {_residuals(fit)}")
    if len(results) >= 2:
        link = fit_link([(o, world, nbytes, t) for o, nbytes, t in results])
        notes.append(f"link (all ops together, what --save gives estimate): launch {link.launch_s * 1e6:,.2f} us, "
                     f"alpha {link.step_latency_s * 1e6:,.2f} us per ring step, beta "
                     f"{format_si(link.bandwidth_bytes_per_s, 'B/s')}; {_residuals(link)}")
    if got["skipped"]:
        notes.append(f"not run (buffers would not fit in a third of free memory): "
                     f"{', '.join(f'{s:,} B' for s in got['skipped'])}")
    if save is not None:
        import datetime

        from tfcalc import __version__
        from tfcalc.calc.calibration import KIND, VERSION, load_calibration_v2
        from tfcalc.output.files import write_atomic

        data = {"kind": KIND, "version": VERSION, "device_name": got["device"],
                "source": f"tfcalc bench collectives: {got['backend']}, {world} ranks, {got['dtype']}",
                "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "tfcalc_version": __version__,
                "collectives": [{"op": o, "ranks": world, "bytes": nbytes, "seconds": t} for o, nbytes, t in results]}
        data, kept = _merged(save, data, ("gemm", "memory", "launch", "attention"))
        load_calibration_v2(data, "measured collectives")  # what is written must read back
        write_atomic(save, json.dumps(data, indent=1) + "\n")
        notes.append(f"wrote {save}{' (kept its ' + ', '.join(kept) + ')' if kept else ''}: tfcalc estimate "
                     f"--calibration {save} prices collectives on the fitted link")
    emit(rows, COLLECTIVE_COLUMNS, fmt, output, title=f"Collectives: {got['device']}", notes=tuple(notes))
