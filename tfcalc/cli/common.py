"""What every command shares: option types, model resolution, checks before work, and the way a run ends.

Errors become one line, ``error: ...``, on stderr and an exit code: 0 success, 1 runtime failure, 2 usage
error, 130 Ctrl-C, 143 SIGTERM (``tfcalc.errors``). ``handle_errors`` does it for a command's own failures,
``TfcalcGroup`` for everything around it (Click's parsing, signals, stdout that cannot be written).
"""

import functools
import inspect
import os
import signal
import sys
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, ParamSpec, TypeVar

import typer
from typer.core import TyperGroup

try:  # Typer >= 0.26 carries its own copy of Click; older Typers use Click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - depends on the installed Typer
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from tfcalc.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_USAGE,
    Interrupted,
    Terminated,
    TfcalcError,
    UsageError,
)
from tfcalc.spec.model import ModelSpec
from tfcalc.units import parse_size, split_list

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def complete_preset(kind: str) -> Callable[[str], list[str]]:
    """Shell completion of preset names of ``kind`` (``tfcalc --install-completion``); runs only when a shell asks."""

    def names(incomplete: str) -> list[str]:
        from tfcalc.spec.presets import preset_names

        return [name for name in preset_names(kind) if name.startswith(incomplete.lower())]

    return names


def complete_engine(incomplete: str) -> list[str]:
    """Shell completion of ``--engine``: ideal, the engines and their version presets."""
    from tfcalc.spec.presets import engine_choices

    return [name for name in engine_choices() if name.startswith(incomplete.lower())]


def complete_columns(incomplete: str) -> list[str]:
    """Shell completion of ``--columns``: the registered column keys (the last item of a comma list)."""
    from tfcalc.output.columns import REGISTRY

    done, _, last = incomplete.rpartition(",")
    prefix = done + "," if done else ""
    return [prefix + key for key in REGISTRY if key.startswith(last)]


PresetOpt = Annotated[list[str] | None, typer.Option(
    "--preset", "-p", help="Model preset name or a YAML file in the preset format; repeat or comma-separate "
    "to compare models.", show_default=False, autocompletion=complete_preset("model"))]


def file_path(text: str) -> Path:
    """A file option's name as given: an empty one is refused (``Path("")`` would be the folder ".")."""
    if not text.strip():
        raise typer.BadParameter("an empty file name")
    return Path(text)


def choice(text: str) -> str:
    """An enumerated option's value as its choices are spelled, in lower case (``--format CSV`` is csv, ``--device
    CPU`` cpu): Typer's ``parser`` for them; a value that is no choice is still refused by the option's check."""
    return text.lower()


ConfigOpt = Annotated[list[Path] | None, typer.Option(
    "--config", "-c", help="A Hugging Face config.json; repeatable.", show_default=False, parser=file_path)]
ContextOpt = Annotated[list[str] | None, typer.Option(
    "--context", help="Context length(s) in tokens: 8192, 128k (=131072), 1m, lists 4k,32k; "
    "default: the model's max context.", show_default=False)]
BatchOpt = Annotated[list[str], typer.Option(
    "--batch", "-b", help="Concurrent sequences; lists make sweeps (1,8,64).")]
KvDtypeOpt = Annotated[list[str] | None, typer.Option(
    "--kv-dtype", help="KV-cache format(s): bf16, fp16, fp32, fp8, int8, nvfp4... default: the one the "
    "checkpoint declares where the engine follows it (ModelOpt fp8), else the model's float dtype.",
    show_default=False)]
FormatOpt = Annotated[str | None, typer.Option(
    "--format", "-f", help="table | csv | json (default: from --output's extension, else table).",
    show_default=False, parser=choice)]
OutputOpt = Annotated[Path | None, typer.Option(
    "--output", "-o", help="Write to this file (replaced atomically; devices and - are written to) instead of "
    "stdout.", show_default=False, parser=file_path)]


WeightsOpt = Annotated[list[str] | None, typer.Option(
    "--weights-dtype", "-w", help="Weight format(s): bf16, fp8, int4-g128, nvfp4, lists, or per component "
    "(experts=mxfp4,default=bf16); default: the checkpoint's.", show_default=False)]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Also draw a PNG chart here (needs matplotlib).",
                                              show_default=False, parser=file_path)]
ExplainOpt = Annotated[bool, typer.Option("--explain", help="Print the formula trace behind each row.")]
EngineOpt = Annotated[list[str] | None, typer.Option(
    "--engine", "-e", help="Engine version: vllm (default; its current version), vllm@0.19 (the one covering a "
    "release), sglang, trtllm, gpt-fast, ideal (plain memory arithmetic), a preset (vllm-0.17) or an engine YAML; "
    "lists compare. Default from $TFCALC_ENGINE, else vllm.", envvar="TFCALC_ENGINE", show_default=False,
    autocompletion=complete_engine)]

# The serving engines' own flags, named as vLLM names them (plan, estimate and capacity share these definitions).
ListOpt = list[str] | None
TensorParallelOpt = Annotated[ListOpt, typer.Option(
    "--tensor-parallel-size", "--tp", "-tp", help="Tensor-parallel degree(s) (vLLM --tensor-parallel-size); lists "
    "sweep, or name the degrees a search may use.", show_default=False)]
PipelineParallelOpt = Annotated[ListOpt, typer.Option(
    "--pipeline-parallel-size", "--pp", "-pp", help="Pipeline-parallel degree(s) (vLLM --pipeline-parallel-size); "
    "default 1; lists sweep, or name the degrees a search may use.", show_default=False)]
MaxModelLenOpt = Annotated[ListOpt, typer.Option(
    "--max-model-len", "--context", help="Context length(s) in tokens (vLLM --max-model-len): 8192, 128k, lists "
    "4k,32k.", show_default=False)]
KvCacheDtypeOpt = Annotated[ListOpt, typer.Option(
    "--kv-cache-dtype", help="Same as --kv-dtype (vLLM's name): bf16, fp8...", show_default=False)]
GpuMemoryUtilizationOpt = Annotated[ListOpt, typer.Option(
    "--gpu-memory-utilization", "--mem-fraction-static", "--free-gpu-memory-fraction",
    help="The engine's memory fraction (vLLM gpu_memory_utilization, SGLang mem_fraction_static, TensorRT-LLM "
    "free_gpu_memory_fraction); default: the engine's.", show_default=False)]
BlockSizeOpt = Annotated[ListOpt, typer.Option(
    "--block-size", help="KV block size(s) in tokens; default: the engine's (vLLM 16).", show_default=False)]
RedundantExpertsOpt = Annotated[int, typer.Option(
    "--redundant-experts", min=0, max=1 << 16, help="EPLB's expert replicas (vLLM --eplb-config "
    "num_redundant_experts, SGLang --ep-num-redundant-experts): each GPU of an expert-parallel layout holds (experts "
    "+ N) / ep of them, so ep need divide experts + N (DeepSeek-V3 with 32: ep 72).")]


def check_runtime_overhead(given: bool, engines: list) -> None:
    """--runtime-overhead sizes the reserve of the plain arithmetic (--engine ideal, gpt-fast) only; a serving
    engine measures its own at startup (its profiling run), so the option with no such engine is an error."""
    if given and all(e is not None and e.budget != "ideal" for e in engines):
        raise UsageError("--runtime-overhead applies to --engine ideal or gpt-fast only; the budget of "
                         f"{', '.join(e.name for e in engines)} counts startup's own memory itself")


def check_redundant_experts(specs: Sequence[Any], redundant_experts: int, eps: Sequence[int] = (2,),
                            tps: Sequence[int] = ()) -> None:
    """--redundant-experts needs MoE models and, in some layout asked for, whole experts per GPU (ep >= tp, ep >= 2:
    ``shard.layout_redundant_experts``)."""
    from tfcalc.calc.shard import layout_redundant_experts

    if not redundant_experts:
        return
    dense = [spec.name for spec in specs if spec.moe is None]
    if dense:
        raise UsageError(f"--redundant-experts needs an MoE model: {', '.join(dense)} has no experts")
    if not any(layout_redundant_experts(1, tp, ep) for tp in tps or (1,) for ep in eps):
        raise UsageError("--redundant-experts needs whole experts per GPU: give --ep 2 or more, at least --tp")


MaxNumSeqsOpt = Annotated[ListOpt, typer.Option(
    "--max-num-seqs", help="Sequences the engine schedules at once (vLLM --max-num-seqs; sizes its sampler and CUDA "
    "graphs); default: the engine's for the GPU (vLLM 1024 on GPUs of >= 70 GiB but the A100, else 256).",
    show_default=False)]
ExtensibleKvCacheOpt = Annotated[bool | None, typer.Option(
    "--enable-extensible-kv-cache/--no-enable-extensible-kv-cache", help="vLLM 0.34+: size the KV cache after "
    "warm-up (on, the default where supported) or from profiling estimates at utilization 0.92 (off: as with "
    "--kv-cache-memory-bytes, or NIXL without an IMEX channel).", show_default=False)]
KvCacheMemoryOpt = Annotated[str | None, typer.Option(
    "--kv-cache-memory-bytes", "--kv-cache-memory", help="vLLM 0.11+: the KV cache per GPU, set outright (bytes; 40g "
    "= 40 x 2^30): utilization no longer sizes it; a configuration fits only if the rest still fits beside it "
    "(0.34+ runs without its extensible cache then). Other engines size their own.", show_default=False)]
ModelRunnerOpt = Annotated[str | None, typer.Option(
    "--model-runner", help="vLLM 0.22-0.31: run the model on V1 or V2 whatever the release picks for it "
    "(VLLM_USE_V2_MODEL_RUNNER=0 / 1, which capacity's vllm serve line sets). Default: the release's choice by "
    "model.", show_default=False)]
MaxNumBatchedTokensOpt = Annotated[ListOpt, typer.Option(
    "--max-num-batched-tokens", "--prefill-chunk", help="Tokens per forward pass, the chunked-prefill budget (vLLM "
    "--max-num-batched-tokens); default: the engine's for the GPU (vLLM 8192 on GPUs of >= 70 GiB but the A100, "
    "else 2048).",
    show_default=False)]


def kv_cache_memory_bytes(text: str | None, engines: list) -> int | None:
    """--kv-cache-memory-bytes in bytes, checked: at least one engine asked takes a set size (vLLM 0.11+)."""
    from tfcalc.calc.engine import takes_kv_cache_memory

    if text is None:
        return None
    size = parse_size(text, "--kv-cache-memory-bytes")
    if not any(takes_kv_cache_memory(e) for e in engines):
        raise UsageError("--kv-cache-memory-bytes sets vLLM's KV cache (0.11+): no engine asked takes it")
    return size


def engines_asked(values: list[str] | None, extensible_kv_cache: bool | None, model_runner: str | None) -> list:
    """``engine_list`` with vLLM's extensible KV cache (``--[no-]enable-extensible-kv-cache``) and model runner
    (``--model-runner``) as asked; None keeps each release's own."""
    from tfcalc.spec.engine import with_extensible_kv_cache, with_model_runners

    return with_model_runners(with_extensible_kv_cache(engine_list(values), extensible_kv_cache), model_runner)


def engine_list(values: list[str] | None) -> list:
    """``ideal`` (None: the plain memory arithmetic), ``vllm``, ``vllm@0.19``, ``sglang``, ``trtllm``, ``gpt-fast``,
    a preset name (``vllm-0.17``) or an engine YAML; the one reading of ``--engine`` for every command."""
    from tfcalc.spec.presets import load_engine

    names = [item for value in values or ["vllm"] for item in split_list(value, "--engine")]
    if not names:
        raise UsageError("name an engine: --engine vllm (or sglang, trtllm, gpt-fast, ideal, NAME@VERSION)")
    return [None if name == "ideal" else load_engine(name) for name in names]


def float_list(values: list[str] | None, what: str, high: float | None = None, low: float = 0.0) -> list[float]:
    from tfcalc.units import parse_float

    return [parse_float(item, what, low, high) for value in values or [] for item in split_list(value, what)]


# --compute/--bandwidth-efficiency: 0.1 % of peak and up, as low as a profile measures (a tiny model on a CPU
# prefills at under 1 % of its peak, and its calibration file holds that; a factor near 0 would stall every step)
MIN_EFFICIENCY = 0.001


def weight_precisions(values: list[str] | None) -> list:
    from tfcalc.cli.memory import parse_weight_dtypes

    return parse_weight_dtypes(values)


def read_calibration(path: Path):  # noqa: ANN201 - tfcalc.calc.calibration.Calibration | Efficiency
    """Any file ``--calibration`` takes, validated: a ``bench calibrate`` file, efficiency factors, or the rows of
    a ``tfcalc profile`` JSON run (factors derived by ``tfcalc.profile.efficiency``, which imports no torch)."""
    from tfcalc.calc.calibration import load_calibration
    from tfcalc.spec.presets import read_data_file

    data = read_data_file(path, allow_list=True)
    if isinstance(data, list):
        from tfcalc.profile.efficiency import efficiency_from_rows

        data = efficiency_from_rows(data, str(path))
    return load_calibration(data, str(path))


def rate_overrides(compute: list[float], bandwidth: list[float], calibration: Path | None) -> list[tuple]:
    """[(rates function or None, source)]: one per --compute/--bandwidth-efficiency pair, or the calibration's; a
    rates function maps (gpu, the GPU's rates, phase) to the rates the latency model uses."""
    if calibration is not None:
        if compute or bandwidth:
            raise UsageError("give --calibration or --compute-efficiency/--bandwidth-efficiency, not both")
        from tfcalc.calc.calibration import CalibratedRates

        cal = read_calibration(calibration)
        return [(CalibratedRates(cal), cal.source)]
    if not compute and not bandwidth:
        return [(None, "")]
    from tfcalc.calc.calibration import EfficiencyRates

    out = []
    for c in compute or [None]:
        for b in bandwidth or [None]:
            parts = ([f"compute {c}"] if c else []) + ([f"bandwidth {b}"] if b else [])
            out.append((EfficiencyRates(c, b), "command line: " + ", ".join(parts)))
    return out


# The table options every command has: ``handle_errors`` adds them, so that each table obeys them the same way.
WideOpt = Annotated[bool, typer.Option(
    "--wide", help="Show every column in the table (CSV and JSON always carry every column).")]
ColumnsOpt = Annotated[list[str] | None, typer.Option(
    "--columns", help="Show exactly these columns, by their CSV/JSON names (the first line of -f csv lists "
    "this command's); also selects the CSV/JSON columns.", show_default=False, autocompletion=complete_columns)]


def parse_table_view(wide: bool, columns: list[str] | None):  # -> tfcalc.output.TableView
    """``--wide`` / ``--columns`` as a TableView; an unknown column name is a usage error, found before any work."""
    from tfcalc.output import TableView
    from tfcalc.output.columns import REGISTRY, suggest_columns

    keys = tuple(dict.fromkeys(item.lower() for value in columns or [] for item in split_list(value, "--columns")))
    if columns is not None and not keys:
        raise UsageError("--columns needs at least one column name (the CSV/JSON keys: run with -f csv)")
    if keys and wide:
        raise UsageError("give --wide (every column) or --columns (these columns), not both")
    for key in keys:
        if key not in REGISTRY:
            hints = suggest_columns(key, REGISTRY)
            raise UsageError(f"unknown column '{key}'" + (f"; did you mean {', '.join(hints)}?" if hints else
                                                          " (the names are the CSV/JSON keys: run with -f csv)"))
    return TableView(wide=wide, keys=keys)


# Options whose values are written (outputs) or read (inputs), checked against each other before any work.
OUTPUT_OPTIONS = {"output": "--output", "plot": "--plot", "save_calibration": "--save-calibration", "save": "--save"}
INPUT_OPTIONS = {"preset": "--preset", "config": "--config", "calibration": "--calibration", "gpu": "--gpu",
                 "lengths_csv": "--lengths-csv", "engine": "--engine", "interconnect": "--interconnect",
                 "inter_node": "--inter-node"}


def print_error(message: str) -> None:
    """``error: message`` as one line on stderr, control characters removed; silent if stderr is closed."""
    from tfcalc.output import print_stderr

    print_stderr(f"error: {message}")


def fail(message: str, code: int) -> typer.Exit:
    """Print ``error: message`` and return the Exit to raise: ``raise fail("...", 1)``."""
    print_error(message)
    return typer.Exit(code)


def _paths(value: object) -> list[str | Path]:
    """The file names in an option value: a path, a string, or a list of them (comma lists split)."""
    if value is None or isinstance(value, bool):
        return []
    if isinstance(value, Path):
        return [value]
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, (list, tuple)):
        return [path for item in value for path in _paths(item)]
    return []


def check_before_work(options: dict[str, object]) -> None:
    """Usage checks every command gets before it does any work, from its options by name.

    ``--format`` against ``--output``'s extension, ``--plot``'s file type, and the output paths (``output``,
    ``plot``, ``save_calibration``, ``save``) against each other, against the input files (``INPUT_OPTIONS``
    values that are files, a model or GPU preset named by name) and the bundled preset folder: see
    ``tfcalc.output.files.check_outputs``.
    """
    outputs = [(flag, options[name]) for name, flag in OUTPUT_OPTIONS.items() if options.get(name) is not None]
    if "output" in options and "fmt" in options:
        from tfcalc.output import resolve_format

        resolve_format(options["fmt"], options["output"])  # type: ignore[arg-type]
    if options.get("plot") is not None:
        from tfcalc.output.plot import check_plot_path

        check_plot_path(Path(options["plot"]))  # type: ignore[arg-type]
    if outputs:
        from tfcalc.output.files import check_outputs
        from tfcalc.spec.presets import find_preset, preset_path, preset_root

        inputs = [(flag, path) for name, flag in INPUT_OPTIONS.items() for path in _paths(options.get(name))]
        # A preset named by name is an input file too (writing over the bundled presets is refused).
        for name, kind in (("preset", "model"), ("gpu", "gpu")):
            inputs += [(f"--{name}", preset_path(kind, str(value))) for value in _paths(options.get(name))
                       if isinstance(value, str) and find_preset(kind, value) is not None]
        check_outputs(outputs, inputs)  # type: ignore[arg-type]
        root = preset_root().resolve()  # nor any other bundled preset (an engine or a link named by name)
        for flag, path in outputs:
            if root in Path(os.path.abspath(path)).resolve().parents:  # type: ignore[arg-type]
                raise UsageError(f"{flag} {path} is inside tfcalc's preset folder; refusing to write there")


def handle_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Run a command so that a failure prints one line (``error: ...``) and exits with its code, never a traceback.

    The command also gets the table options every command shares, ``--wide`` and ``--columns`` (``WideOpt``,
    ``ColumnsOpt``; they reach its tables through ``tfcalc.output.table_view``). Before the command runs,
    ``check_before_work`` checks its outputs and format, and ``parse_table_view`` the columns. Codes:
    TfcalcError's own (2 usage, 1 otherwise), 130 for Ctrl-C, 143 for SIGTERM (``tfcalc.errors.Terminated``), 1
    for a bug ("internal error"); a closed pipe on stdout ends quietly with 1.
    """

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from tfcalc.output import table_view

        wide = bool(kwargs.pop("wide", False))
        columns = kwargs.pop("columns", None)
        try:
            check_before_work(kwargs)
            with table_view(parse_table_view(wide, columns)):  # type: ignore[arg-type]
                return command(*args, **kwargs)
        except TfcalcError as exc:
            raise fail(str(exc), exc.exit_code) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM through the entry point's handler
            interrupted = Interrupted.from_exception(exc)
            raise fail(str(interrupted), interrupted.exit_code) from None
        except BrokenPipeError:  # the reader went away (`tfcalc ... | head`): stop quietly, as Unix tools do
            silence_stdout()
            raise typer.Exit(EXIT_FAILURE) from None
        except (typer.Exit, typer.Abort, click_exceptions.ClickException):
            raise
        except OSError as exc:  # a file name the system refuses (too long, a loop of links): the file's, not a bug
            if exc.filename is None:
                raise fail(f"internal error ({type(exc).__name__}): {exc}", EXIT_FAILURE) from None
            name = str(exc.filename)
            shown = name if len(name) <= 80 else f"{name[:40]}...{name[-30:]} ({len(name):,} characters)"
            raise fail(f"{shown}: {exc.strerror or exc}", EXIT_FAILURE) from None
        except Exception as exc:  # a bug: still one line, with the type to report it by
            raise fail(f"internal error ({type(exc).__name__}): {exc}", EXIT_FAILURE) from None

    signature = inspect.signature(command)
    if any(isinstance(p.annotation, str) for p in signature.parameters.values()):  # postponed annotations
        hints = typing.get_type_hints(command, include_extras=True)
        signature = signature.replace(parameters=[p.replace(annotation=hints.get(p.name, p.annotation))
                                                  for p in signature.parameters.values()])
    shared = [inspect.Parameter("wide", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=WideOpt),
              inspect.Parameter("columns", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ColumnsOpt)]
    wrapper.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *shared])  # type: ignore
    wrapper.__annotations__ = {**{p.name: p.annotation for p in signature.parameters.values()}, "wide": WideOpt,
                               "columns": ColumnsOpt}
    return wrapper


def silence_stdout() -> None:
    """Point fd 1 at /dev/null so that the interpreter's final flush of a dead stdout cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def finish_stdout() -> int:
    """Flush stdout at the end of a run; a failure (full disk, closed pipe) is reported here, once: the exit code."""
    stream = sys.stdout
    if stream is None:
        return EXIT_OK
    try:
        stream.flush()
    except BrokenPipeError:
        silence_stdout()
        return EXIT_FAILURE
    except (OSError, ValueError) as exc:
        print_error(f"cannot write to stdout: {getattr(exc, 'strerror', None) or exc}")
        silence_stdout()
        return EXIT_FAILURE
    return EXIT_OK


def _usage_message(exc: click_exceptions.ClickException) -> str:
    """Click's message as one ``error:`` line: lower-case start, no final period, a pointer to --help."""
    message = " ".join(exc.format_message().split())
    if len(message) > 300:  # Click repeats the value given: a 5,000-digit number is not worth a screenful
        message = message[:297] + "..."
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    message = message.removesuffix(".")
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click_exceptions.UsageError) and ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message


_SIGNALS_RECEIVED: list[int] = []


def _received_sigterm() -> bool:
    return signal.SIGTERM in _SIGNALS_RECEIVED


def _on_sigterm(signum: int, frame: object) -> None:
    _SIGNALS_RECEIVED.append(signum)
    raise Terminated()


def install_signal_handlers() -> None:
    """SIGTERM raises ``Terminated`` (a KeyboardInterrupt): cleanup runs, partial results are kept, exit 143.

    Installed by the console entry point only (not on import), in the main thread.
    """
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread
        pass


class TfcalcGroup(TyperGroup):
    """The root command group: every way a run can end becomes one exit code, and errors one ``error:`` line.

    Click's usage errors (an unknown option or command, a missing or malformed value) print as one line and
    exit 2 instead of Click's framed box; Ctrl-C exits 130 and SIGTERM 143, also outside a command; a bug
    prints ``internal error`` and exits 1; stdout is flushed here so that a full disk or a closed stdout is
    reported rather than lost.
    """

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            result = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                                  standalone_mode=False, **extra)
            code = result if isinstance(result, int) and not isinstance(result, bool) else EXIT_OK
        except click_exceptions.ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `tfcalc` alone: Typer has printed the help
                ctx = getattr(exc, "ctx", None)
                print_error(f"name a command (see '{ctx.command_path if ctx else 'tfcalc'} --help')")
                code = EXIT_USAGE
            else:
                print_error(_usage_message(exc))
                code = exc.exit_code
        except typer.Abort:
            print_error("interrupted")
            code = EXIT_SIGINT
        except KeyboardInterrupt as exc:
            interrupted = Interrupted.from_exception(exc)
            print_error(str(interrupted))
            code = interrupted.exit_code
        except TfcalcError as exc:  # raised outside a @handle_errors command (a callback, a group)
            print_error(str(exc))
            code = exc.exit_code
        except BrokenPipeError:
            silence_stdout()
            code = EXIT_FAILURE
        except Exception as exc:
            print_error(f"internal error ({type(exc).__name__}): {exc}")
            code = EXIT_FAILURE
        if code == EXIT_SIGINT and _received_sigterm():  # Click turns any KeyboardInterrupt into 130
            code = EXIT_SIGTERM
        flushed = finish_stdout()
        code = code or flushed
        if standalone_mode:
            sys.exit(code)
        return code


def resolve_models(presets: list[str] | None, configs: list[Path] | None) -> list[ModelSpec]:
    """Presets (names or YAML paths, comma lists allowed) then config.json files, in the order given."""
    from tfcalc.spec.presets import load_model

    specs = [load_model(name) for value in presets or [] for name in split_list(value, "--preset")]
    if configs:
        from tfcalc.spec.hf_config import load_hf_config

        specs.extend(load_hf_config(path) for path in configs)
    if not specs:
        raise UsageError("name a model: --preset NAME (see 'tfcalc presets list') or --config config.json")
    return specs


# Rows one calculator run may sweep (the product of its lists): 100,000 plan rows take about a minute on one core;
# a 2,000 x 2,000 sweep ran for half an hour with nothing to show
MAX_SWEEP_ROWS = 100_000


def check_sweep_size(*lists: Sequence[object]) -> int:
    """The rows a sweep over ``lists`` makes (``tfcalc.report.sweep_rows``), refused before any work past
    ``MAX_SWEEP_ROWS``."""
    from tfcalc.report import sweep_rows

    return check_sweep_rows(sweep_rows(*lists))


def check_sweep_rows(rows: int) -> int:
    """``rows``, refused before any work past ``MAX_SWEEP_ROWS`` (a command that counts its own rows)."""
    if rows > MAX_SWEEP_ROWS:
        raise UsageError(f"the lists given sweep {rows:,} rows, past tfcalc's {MAX_SWEEP_ROWS:,} a run: shorten them "
                         "or split the run")
    return rows


@dataclass(frozen=True)
class Swept(Generic[T]):
    """What a calculator sweep made: its items in order, the number it set out to make, and the Ctrl-C or SIGTERM
    that stopped it (None: it ran to the end)."""

    items: list[T]
    total: int
    stopped: KeyboardInterrupt | None = None

    def finish(self) -> None:
        """Call once the kept rows are written: a stopped sweep then ends as ``Interrupted`` (exit 130 / 143) with
        one line saying how far it got."""
        if self.stopped is not None:
            raise _stopped(self.stopped, len(self.items), self.total)


def _stopped(exc: KeyboardInterrupt, kept: int, total: int) -> Interrupted:
    reason = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
    what = f"kept the {kept:,} of {total:,} rows computed before {reason}" if kept else \
        f"no row of {total:,} computed before {reason}; nothing written"
    return Interrupted.from_exception(exc, what)


def run_sweep(items: Iterable[T], total: int, what: str) -> Swept[T]:
    """Collect a calculator sweep's items (rows, or rows with their traces), with progress on stderr once it runs
    past a second (``tfcalc.output.progress``). Ctrl-C or SIGTERM (``Terminated``) stops it and keeps what was made,
    for the command to write as a complete run would and then call ``finish()``; stopped before the first item it
    raises ``Interrupted`` at once, so that no output (an existing ``--output`` file) is replaced by nothing."""
    from tfcalc.output.progress import Progress

    progress = Progress(total)
    kept: list[T] = []
    try:
        for item in items:
            kept.append(item)
            progress.say(f"{what}: row {len(kept):,} of {total:,}", len(kept))
    except KeyboardInterrupt as exc:
        if not kept:
            raise _stopped(exc, 0, total) from None
        return Swept(kept, total, exc)
    finally:
        progress.close()
    return Swept(kept, total)


def parse_dtype_list(values: list[str] | None) -> list:
    from tfcalc.dtypes import get_dtype

    return [get_dtype(item) for value in values or [] for item in split_list(value, "dtype")]
