"""``tfcalc params``: total and active parameters with a per-component breakdown."""

from tfcalc.cli.common import ConfigOpt, FormatOpt, OutputOpt, PresetOpt, handle_errors, resolve_models
from tfcalc.output import Column, emit

SUMMARY_COLUMNS = [
    Column("model", "model"),
    Column("total_params", "total params", "params"),
    Column("active_params", "active params", "params"),
    Column("non_embedding_params", "non-embedding", "params"),
    Column("total_params", "total (exact)", "int"),
]
BREAKDOWN_COLUMNS = [
    Column("model", "model"),
    Column("component", "component"),
    Column("total_params", "total", "int"),
    Column("active_params", "active per token", "int"),
    Column("share_of_total", "share of total", "percent"),
]


@handle_errors
def params(preset: PresetOpt = None, config: ConfigOpt = None, fmt: FormatOpt = None,
           output: OutputOpt = None) -> None:
    """Total parameters and active parameters per token, by component (embedding, attention, MLP, experts...)."""
    from tfcalc.output import resolve_format
    from tfcalc.report.params import params_breakdown_rows, params_rows

    specs = resolve_models(preset, config)
    rows = params_rows(specs)
    if resolve_format(fmt, output) != "table":
        emit(rows, SUMMARY_COLUMNS, fmt, output)
        return
    conventions = sorted({f"active convention for {r['model']}: {r['active_convention']}" for r in rows
                          if r["total_params"] != r["active_params"]})
    emit(rows, SUMMARY_COLUMNS, fmt, output, title="Parameters", notes=tuple(conventions),
         extra=[("Breakdown", params_breakdown_rows(specs), BREAKDOWN_COLUMNS)])
