"""The tfcalc command line: parse, call the calculator, hand rows to the output layer."""

import typer

from tfcalc.cli import bench, kv_cache, memory, params, presets
from tfcalc.cli import estimate as estimate_cli
from tfcalc.cli import plan as plan_cli
from tfcalc.cli import profile as profile_cli

app = typer.Typer(
    name="tfcalc",
    help="Size transformer inference before you deploy it (parameters, KV cache, memory, fit, rooflines), then "
    "measure what your own GPU does.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(presets.app, name="presets")
app.add_typer(bench.app, name="bench")
app.command("params")(params.params)
app.command("kv-cache")(kv_cache.kv_cache)
app.command("memory")(memory.memory)
app.command("plan")(plan_cli.plan)
app.command("estimate")(estimate_cli.estimate)
app.command("profile")(profile_cli.profile)


def main() -> None:
    """Console-script entry point."""
    app()
