"""``tfcalc memory``: weights + KV cache + activation workspace for a precision choice."""

from typing import Annotated

import typer

from tfcalc.cli.common import (
    BatchOpt,
    ConfigOpt,
    ContextOpt,
    FormatOpt,
    KvDtypeOpt,
    OutputOpt,
    PresetOpt,
    check_sweep_size,
    handle_errors,
    parse_dtype_list,
    resolve_models,
    run_sweep,
)
from tfcalc.output import emit, pick
from tfcalc.units import parse_size, parse_sizes, split_list

COLUMNS = pick("model", "weights_dtype", "kv_dtype", "context", "batch", "weights_bytes", "kv_cache_bytes",
               "activation_bytes", "total_bytes")


def parse_weight_dtypes(values: list[str] | None) -> list:
    """Each value is one mixed spec (``experts=mxfp4,default=bf16``) or a comma list of plain dtypes."""
    from tfcalc.dtypes import parse_weight_precision

    precisions = []
    for value in values or []:
        items = [value] if "=" in value else split_list(value, "--weights-dtype")
        precisions.extend(parse_weight_precision(item) for item in items)
    return precisions


@handle_errors
def memory(preset: PresetOpt = None, config: ConfigOpt = None, context: ContextOpt = None,
           batch: BatchOpt = ["1"],  # noqa: B006 - Typer reads the default, never mutates it
           weights_dtype: Annotated[list[str] | None, typer.Option(
               "--weights-dtype", "-w", help="Weight format: bf16, fp8, int4-g128, mxfp4, nvfp4..., a list "
               "(bf16,fp8) or per component (experts=mxfp4,default=bf16); default: the checkpoint's.",
               show_default=False)] = None,
           kv_dtype: KvDtypeOpt = None,
           activation_dtype: Annotated[str, typer.Option(help="Activation format for the workspace estimate.")]
           = "bf16",
           prefill_chunk: Annotated[str, typer.Option(
               help="Tokens in one forward pass (chunked prefill), for the activation estimate.")] = "8k",
           fmt: FormatOpt = None, output: OutputOpt = None) -> None:
    """Memory for weights, KV cache and activation workspace, per weight / KV format, context and batch."""
    from tfcalc.dtypes import get_dtype
    from tfcalc.report.memory import ACTIVATION_FORMULA, MLA_ACTIVATION, exception_notes, iter_memory_rows
    from tfcalc.report.params import mtp_notes

    specs = resolve_models(preset, config)
    contexts, batches = parse_sizes(context, "context"), parse_sizes(batch, "batch")
    kv_dtypes = parse_dtype_list(kv_dtype)
    precisions = parse_weight_dtypes(weights_dtype)
    total = check_sweep_size(specs, contexts, batches, precisions, kv_dtypes)
    swept = run_sweep(iter_memory_rows(specs, contexts, batches, precisions, kv_dtypes, get_dtype(activation_dtype),
                                       parse_size(prefill_chunk, "prefill chunk")), total, "memory")
    rows = swept.items
    kept = "lm_head, router and vision encoder" if any(s.encoder is not None for s in specs) else "lm_head and router"
    notes = ("weights include scale overhead of block formats; as quantized checkpoints ship, a quantized format "
             f"leaves biases, norms, the embedding, {kept} in bf16 unless named (default=fp8,lm_head=fp8 "
             "quantizes lm_head too); the same rule as 'tfcalc plan'. GiB = 2^30 bytes.", ACTIVATION_FORMULA + ".",
             *((MLA_ACTIVATION + ".",) if any(s.mla is not None for s in specs) else ()),
             *exception_notes(specs), *mtp_notes(specs))
    emit(rows, COLUMNS, fmt, output, title="Memory", notes=notes)
    swept.finish()
