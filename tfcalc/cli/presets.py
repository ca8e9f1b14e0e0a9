"""``tfcalc presets list`` and ``tfcalc presets show NAME``: model, GPU, engine and interconnect presets."""

from typing import Annotated

import typer

from tfcalc.cli.common import FormatOpt, OutputOpt, choice, handle_errors
from tfcalc.errors import UsageError
from tfcalc.output import emit, pick, resolve_format, wide

app = typer.Typer(help="List and show the bundled presets: models, GPUs, engine versions and interconnects.",
                  no_args_is_help=True)

KindOpt = Annotated[str, typer.Option("--kind", "-k", help="model | gpu | engine | interconnect", parser=choice)]
ShowKindOpt = Annotated[str | None, typer.Option(
    "--kind", "-k", help="model | gpu | engine | interconnect (default: whichever has a preset of that name or "
    "alias).", show_default=False, parser=choice)]

_FLOPS = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")
LIST_COLUMNS = {
    "model": pick("name", wide("display_name"), "attention", wide("layers", "hidden_size"), "moe", "total_params",
                  "active_params", wide("max_context", "native_dtype")),  # the default fits 80 columns
    "gpu": pick("name", wide("display_name"), "gpu_memory_bytes", "hbm_bandwidth_bytes_per_s",
                wide("fp32_dense_flops_per_s", "tf32_dense_flops_per_s"), "bf16_dense_flops_per_s",
                wide("fp16_dense_flops_per_s"), "fp8_dense_flops_per_s",
                wide("int8_dense_flops_per_s", "fp4_dense_flops_per_s", "interconnect"),
                "interconnect_bandwidth_bytes_per_s"),
    "engine": pick("name", "engine", "releases", "default", "budget", "display_name"),
    "interconnect": pick("name", "link_bandwidth_bytes_per_s", "nccl_algorithm", "custom_allreduce",
                         "display_name"),
}
SHOW_COLUMNS = pick("field", "value", "ref")


def _check_kind(kind: str) -> None:
    from tfcalc.spec.presets import PRESET_KINDS

    if kind not in PRESET_KINDS:
        raise UsageError(f"unknown preset kind '{kind}' (choose {', '.join(PRESET_KINDS)})")


def _find(name: str, kind: str | None) -> tuple[str, str]:
    """(kind, preset name) for a preset name or alias, any case; names only, never files."""
    from tfcalc.spec.presets import PRESET_KINDS, find_preset, looks_like_path, preset_names, suggest

    kinds = [kind] if kind is not None else list(PRESET_KINDS)
    found = [(k, preset) for k in kinds if (preset := find_preset(k, name)) is not None]
    if len(found) == 1:
        return found[0]
    if found:
        raise UsageError(f"'{name}' names a {found[0][0]} and a {found[1][0]} preset; pass --kind")
    what = f"{kind} preset" if kind is not None else "preset"
    owner, _, repo = name.partition("/")
    repo_id = bool(owner) and bool(repo) and "/" not in repo and not owner.startswith(".") and not name.endswith(
        (".yaml", ".yml", ".json"))  # owner/name: an unknown alias (an HF repo id), not a path
    if looks_like_path(name) and not repo_id:
        raise UsageError(f"'{name}' is not a {what} name: 'presets show' takes names from 'tfcalc presets list'; "
                         "read your own file with --preset FILE (or --gpu FILE)")
    hints = suggest(name, sorted(n for k in kinds for n in preset_names(k)))
    hint = f"; did you mean {', '.join(hints)}?" if hints else "; run 'tfcalc presets list'"
    raise UsageError(f"unknown {what} '{name}'{hint}")


@app.command("list")
@handle_errors
def list_presets(kind: KindOpt = "model", fmt: FormatOpt = None, output: OutputOpt = None) -> None:
    """Every preset of a kind, with its headline facts."""
    from tfcalc.report.presets import preset_rows

    _check_kind(kind)
    emit(preset_rows(kind), LIST_COLUMNS[kind], fmt, output, title=f"{kind} presets")


@app.command("show")
@handle_errors
def show(name: Annotated[str, typer.Argument(help="Preset name or alias (any case), e.g. llama3-70b, "
                                             "meta-llama/Llama-3.1-70B, h100-sxm, vllm-0.21 or nvlink4.")],
         kind: ShowKindOpt = None, fmt: FormatOpt = None, output: OutputOpt = None) -> None:
    """Every field of one preset, with its source."""
    from tfcalc.report.presets import preset_field_rows

    if kind is not None:
        _check_kind(kind)
    kind, preset = _find(name, kind)
    if output is not None:
        from tfcalc.output.files import check_outputs
        from tfcalc.spec.presets import preset_path

        check_outputs([("--output", output)], [("preset", preset_path(kind, preset))])
    rows = preset_field_rows(kind, preset)
    notes: tuple[str, ...] = ()
    if resolve_format(fmt, output) == "table":
        # The table cites each source once, by number, and lists the aliases under it; CSV/JSON keep the full
        # citation on every row and the aliases as a row.
        aliases = [str(row["value"]) for row in rows if row["field"] == "aliases"]
        rows = [row for row in rows if row["field"] != "aliases"]
        citations = list(dict.fromkeys(str(row["source"]) for row in rows if row["source"]))
        rows = [{**row, "ref": f"[{citations.index(str(row['source'])) + 1}]" if row["source"] else ""}
                for row in rows]
        notes = tuple(f"also known as: {a}" for a in aliases)
        notes += tuple(f"[{i}] {citation}" for i, citation in enumerate(citations, 1))
    emit(rows, SHOW_COLUMNS, fmt, output, title=f"{kind} preset {preset}", notes=notes)
