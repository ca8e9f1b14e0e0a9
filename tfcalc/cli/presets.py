"""``tfcalc presets list`` and ``tfcalc presets show NAME``."""

from typing import Annotated

import typer

from tfcalc.cli.common import FormatOpt, OutputOpt, handle_errors
from tfcalc.errors import UsageError
from tfcalc.output import Column, emit

app = typer.Typer(help="List and show model (and GPU) presets.", no_args_is_help=True)

KindOpt = Annotated[str, typer.Option("--kind", "-k", help="model | gpu")]


def _check_kind(kind: str) -> None:
    from tfcalc.spec.presets import PRESET_KINDS

    if kind not in PRESET_KINDS:
        raise UsageError(f"unknown preset kind '{kind}' (choose {' or '.join(PRESET_KINDS)})")


@app.command("list")
@handle_errors
def list_presets(kind: KindOpt = "model", fmt: FormatOpt = None, output: OutputOpt = None) -> None:
    """Every preset of a kind, with its headline shape."""
    from tfcalc.report.presets import preset_rows

    _check_kind(kind)
    rows, columns = preset_rows(kind)
    emit(rows, columns, fmt, output, title=f"{kind} presets")


@app.command("show")
@handle_errors
def show(name: Annotated[str, typer.Argument(help="Preset name.")], kind: KindOpt = "model",
         fmt: FormatOpt = None, output: OutputOpt = None) -> None:
    """Every field of one preset, with its source."""
    from tfcalc.report.presets import preset_field_rows

    _check_kind(kind)
    rows = preset_field_rows(kind, name)
    # The table cites each source once, by number; CSV/JSON keep the full citation on every row.
    citations = list(dict.fromkeys(str(row["source"]) for row in rows if row["source"]))
    for row in rows:
        row["ref"] = f"[{citations.index(str(row['source'])) + 1}]" if row["source"] else ""
    columns = [Column("field", "field"), Column("value", "value"), Column("ref", "source")]
    notes = tuple(f"[{i}] {citation}" for i, citation in enumerate(citations, 1))
    emit(rows, columns, fmt, output, title=f"{kind} preset {name}", notes=notes)
