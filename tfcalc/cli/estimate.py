"""``tfcalc estimate``: roofline prefill and decode times, ideal and after efficiency factors."""

import sys
from pathlib import Path
from typing import Annotated

import typer

from tfcalc.cli.common import (
    BatchOpt,
    ConfigOpt,
    FormatOpt,
    KvDtypeOpt,
    OutputOpt,
    PresetOpt,
    handle_errors,
    parse_dtype_list,
    resolve_models,
)
from tfcalc.cli.plan import (
    ExplainOpt,
    GpuOpt,
    PlotOpt,
    WeightsOpt,
    float_list,
    gpu_list,
    print_traces,
    weight_precisions,
)
from tfcalc.output import Column, emit
from tfcalc.units import parse_sizes

COLUMNS = [
    Column("model", "model"), Column("gpu", "GPU"), Column("tp", "tp", "int"), Column("batch", "batch", "int"),
    Column("prompt_len", "prompt", "int"), Column("gen_len", "gen", "int"),
    Column("ttft_s_ideal", "TTFT ideal", "seconds"), Column("ttft_s", "TTFT", "seconds"),
    Column("prefill_bound", "prefill bound"),
    Column("decode_bytes_per_step", "bytes/step", "bytes"),
    Column("tpot_s_ideal", "TPOT ideal", "seconds"), Column("tpot_s", "TPOT", "seconds"),
    Column("decode_tokens_per_s_ideal", "tok/s ideal", "rate", "tok/s"),
    Column("decode_tokens_per_s", "tok/s", "rate", "tok/s"), Column("decode_bound", "decode bound"),
    Column("e2e_s", "end-to-end", "seconds"),
]


def _turning_note(row: dict) -> str:
    """The decode batch from which the step is compute-bound; it does not depend on the row's own batch."""
    where = f"{row['model']} on {row['gpu']} (tp {row['tp']}, prompt {row['prompt_len']:,}, gen {row['gen_len']:,})"
    if row["decode_turning_point_batch"]:
        return f"{where}: decode turns compute-bound from batch {row['decode_turning_point_batch']:,}"
    return (f"{where}: decode never turns compute-bound: each sequence's KV reads keep its FLOP/byte below the "
            "GPU's ridge point")


def _efficiencies(compute: list[float], bandwidth: list[float], calibration: Path | None) -> list:
    from tfcalc.calc.roofline import (
        DEFAULT_BANDWIDTH_EFFICIENCY,
        DEFAULT_COMPUTE_EFFICIENCY,
        Efficiency,
        load_calibration,
    )
    from tfcalc.errors import UsageError

    if calibration is not None:
        if compute or bandwidth:
            raise UsageError("give --calibration or --compute-efficiency/--bandwidth-efficiency, not both")
        from tfcalc.spec.presets import read_data_file

        return [load_calibration(read_data_file(calibration, allow_list=True), str(calibration))]
    effs = []
    for c in compute or [DEFAULT_COMPUTE_EFFICIENCY]:
        for b in bandwidth or [DEFAULT_BANDWIDTH_EFFICIENCY]:
            source = "defaults (docs/planning.md)" if not compute and not bandwidth else "command line"
            effs.append(Efficiency(c, c, b, b, source))
    return effs


@handle_errors
def estimate(preset: PresetOpt = None, config: ConfigOpt = None,
             gpu: GpuOpt = ["h100-sxm"],  # noqa: B006 - Typer reads the default, never mutates it
             tp: Annotated[list[str], typer.Option("--tp", help="Tensor-parallel degree(s).")] = ["1"],  # noqa: B006
             batch: BatchOpt = ["1"],  # noqa: B006
             prompt_len: Annotated[list[str], typer.Option("--prompt-len", help="Prompt tokens (1k = 1024).")]
             = ["1k"],  # noqa: B006
             gen_len: Annotated[list[str], typer.Option("--gen-len", help="Generated tokens.")]
             = ["256"],  # noqa: B006
             weights_dtype: WeightsOpt = None, kv_dtype: KvDtypeOpt = None,
             compute_efficiency: Annotated[list[str] | None, typer.Option(
                 "--compute-efficiency", help="Fraction of dense peak FLOP/s reached (default 0.6).",
                 show_default=False)] = None,
             bandwidth_efficiency: Annotated[list[str] | None, typer.Option(
                 "--bandwidth-efficiency", help="Fraction of HBM / link bandwidth reached (default 0.6).",
                 show_default=False)] = None,
             calibration: Annotated[Path | None, typer.Option(
                 "--calibration", help="JSON of measured efficiencies per phase (schema: docs/planning.md).",
                 show_default=False)] = None,
             explain: ExplainOpt = False, plot: PlotOpt = None, fmt: FormatOpt = None,
             output: OutputOpt = None) -> None:
    """Prefill (TTFT) and decode (TPOT, tokens/s) rooflines per GPU, ideal and expected, with their bounds."""
    from tfcalc.report.plan import estimate_rows

    specs = resolve_models(preset, config)
    gpus = gpu_list(gpu)
    effs = _efficiencies(float_list(compute_efficiency, "compute efficiency", 1.0),
                         float_list(bandwidth_efficiency, "bandwidth efficiency", 1.0), calibration)
    rows, traces = estimate_rows(specs, gpus, parse_sizes(tp, "tp"), parse_sizes(batch, "batch"),
                                 parse_sizes(prompt_len, "prompt length"), parse_sizes(gen_len, "generation length"),
                                 weight_precisions(weights_dtype), parse_dtype_list(kv_dtype), effs)
    notes = ("ideal = 100 % of dense peak and HBM bandwidth; expected = after efficiency factors "
             f"({rows[0]['efficiency_source']}). TPOT at the mean decode context; tok/s aggregate over the batch.",
             *dict.fromkeys(_turning_note(r) for r in rows))
    emit(rows, COLUMNS, fmt, output, title="Estimate", notes=notes)
    if explain:
        print_traces(rows, traces, ("model", "gpu", "tp", "batch", "prompt_len", "gen_len"))
    if plot is not None:
        from tfcalc.output.plot import plot_roofline

        plot_roofline(plot, rows)
        sys.stderr.write(f"wrote plot to {plot}\n")
