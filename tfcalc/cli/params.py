"""``tfcalc params``: total and active parameters with a per-component breakdown."""

from tfcalc.cli.common import ConfigOpt, FormatOpt, OutputOpt, PresetOpt, handle_errors, resolve_models
from tfcalc.output import emit, pick

SUMMARY_COLUMNS = pick("model", "total_params", "active_params", "non_embedding_params")
BREAKDOWN_COLUMNS = pick("model", "component", "component_params", "component_active_params", "share_of_total")


@handle_errors
def params(preset: PresetOpt = None, config: ConfigOpt = None, fmt: FormatOpt = None,
           output: OutputOpt = None) -> None:
    """Total parameters and active parameters per token, by component (embedding, attention, MLP, experts...)."""
    from tfcalc.output import resolve_format
    from tfcalc.report.params import params_breakdown_rows, params_notes, params_rows

    specs = resolve_models(preset, config)
    rows = params_rows(specs)
    if resolve_format(fmt, output) != "table":
        emit(rows, SUMMARY_COLUMNS, fmt, output)
        return
    emit(rows, SUMMARY_COLUMNS, fmt, output, title="Parameters", notes=params_notes(specs),
         extra=[("Breakdown", params_breakdown_rows(specs), BREAKDOWN_COLUMNS)])
