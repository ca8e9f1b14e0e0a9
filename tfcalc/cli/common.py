"""What every command shares: option types, model resolution, and errors turned into one line + exit code."""

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer

from tfcalc.errors import TfcalcError, UsageError
from tfcalc.spec.model import ModelSpec
from tfcalc.units import split_list

P = ParamSpec("P")
R = TypeVar("R")

PresetOpt = Annotated[list[str] | None, typer.Option(
    "--preset", "-p", help="Model preset name or a YAML file in the preset format; repeat or comma-separate "
    "to compare models.", show_default=False)]
ConfigOpt = Annotated[list[Path] | None, typer.Option(
    "--config", "-c", help="A Hugging Face config.json; repeatable.", show_default=False)]
ContextOpt = Annotated[list[str] | None, typer.Option(
    "--context", help="Context length(s) in tokens: 8192, 128k (=131072), 1m, lists 4k,32k; "
    "default: the model's max context.", show_default=False)]
BatchOpt = Annotated[list[str], typer.Option(
    "--batch", "-b", help="Concurrent sequences; lists make sweeps (1,8,64).")]
KvDtypeOpt = Annotated[list[str] | None, typer.Option(
    "--kv-dtype", help="KV-cache format(s): bf16, fp16, fp32, fp8, int8, nvfp4... default: the model's float "
    "dtype.", show_default=False)]
FormatOpt = Annotated[str | None, typer.Option(
    "--format", "-f", help="table | csv | json (default: from --output's extension, else table).",
    show_default=False)]
OutputOpt = Annotated[Path | None, typer.Option(
    "--output", "-o", help="Write to this file (atomically) instead of stdout.", show_default=False)]


def fail(message: str, code: int) -> typer.Exit:
    sys.stderr.write(f"error: {message}\n")
    return typer.Exit(code)


def handle_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Run a command so that a failure prints one line (``error: ...``) and exits 2 (usage) or 1, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except TfcalcError as exc:
            raise fail(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None
        except BrokenPipeError:  # the reader went away (`tfcalc ... | head`): stop quietly, as Unix tools do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(1) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:  # a bug: still one line, with the type to report it by
            raise fail(f"internal error ({type(exc).__name__}): {exc}", 1) from None

    return wrapper


def resolve_models(presets: list[str] | None, configs: list[Path] | None) -> list[ModelSpec]:
    """Presets (names or YAML paths, comma lists allowed) then config.json files, in the order given."""
    from tfcalc.spec.presets import load_model

    specs = [load_model(name) for value in presets or [] for name in split_list(value)]
    if configs:
        from tfcalc.spec.hf_config import load_hf_config

        specs.extend(load_hf_config(path) for path in configs)
    if not specs:
        raise UsageError("name a model: --preset NAME (see 'tfcalc presets list') or --config config.json")
    return specs


def parse_dtype_list(values: list[str] | None) -> list:
    from tfcalc.dtypes import get_dtype

    return [get_dtype(item) for value in values or [] for item in split_list(value)]
