"""The tfcalc command line: parse, call the calculator or the profiler, hand rows to the output layer.

Each command lives in its own module. ``main`` builds an app holding only the command being run, so a
calculator call pays neither for importing nor for building the profiler's many options; ``app`` (the
full tree, for ``--help`` and tests) is built on first use.
"""

import importlib
import inspect
import sys
from collections.abc import Iterable
from typing import Annotated

import typer

HELP = ("Size transformer inference before you deploy it (parameters, KV cache, memory, fit, rooflines), then "
        "measure what your own GPU does.")

# command name -> (module, attribute, whether it is a sub-app of several commands)
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "params": ("tfcalc.cli.params", "params", False),
    "kv-cache": ("tfcalc.cli.kv_cache", "kv_cache", False),
    "memory": ("tfcalc.cli.memory", "memory", False),
    "plan": ("tfcalc.cli.plan", "plan", False),
    "estimate": ("tfcalc.cli.estimate", "estimate", False),
    "capacity": ("tfcalc.cli.capacity", "capacity", False),
    "profile": ("tfcalc.cli.profile", "profile", False),
    "bench": ("tfcalc.cli.bench", "app", True),
    "presets": ("tfcalc.cli.presets", "app", True),
}


def _print_version(value: bool) -> None:
    if value:
        from tfcalc import __version__
        from tfcalc.output import write_stdout

        write_stdout(f"tfcalc {__version__}\n")
        raise typer.Exit()


def _summarise_commands(app: typer.Typer) -> None:
    """Give each command without a ``short_help`` its docstring's first paragraph on one line: Typer's rich
    command list keeps the docstring's line breaks, which break a summary mid-sentence in the table."""
    for info in app.registered_commands:
        if info.short_help is None and info.callback is not None:
            paragraph = (inspect.getdoc(info.callback) or "").split("\n\n")[0]
            info.short_help = " ".join(paragraph.split())


def build_app(names: Iterable[str] = COMMANDS) -> typer.Typer:
    """A Typer app with the named commands (all by default), ending every run through ``TfcalcGroup``."""
    from tfcalc.cli.common import TfcalcGroup

    root = typer.Typer(name="tfcalc", help=HELP, no_args_is_help=True, pretty_exceptions_enable=False,
                       add_completion=True, cls=TfcalcGroup,
                       context_settings={"help_option_names": ["-h", "--help"]})

    @root.callback()
    def tfcalc(version: Annotated[bool, typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit.")] = False,
    ) -> None:  # a group even when it holds one command, so `tfcalc NAME ...` parses the same
        pass

    for name in names:
        module, attribute, is_group = COMMANDS[name]
        target = getattr(importlib.import_module(module), attribute)
        if is_group:
            _summarise_commands(target)
            root.add_typer(target, name=name)
        else:
            root.command(name)(target)
    _summarise_commands(root)
    return root


def main() -> None:
    """Console-script entry point: SIGTERM handled (exit 143), then only the command named on the line built."""
    from tfcalc.cli.common import install_signal_handlers

    install_signal_handlers()
    try:
        name = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
        app = build_app([name] if name in COMMANDS else COMMANDS)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM while starting up, before TfcalcGroup runs
        from tfcalc.cli.common import print_error
        from tfcalc.errors import Interrupted

        interrupted = Interrupted.from_exception(exc)
        print_error(str(interrupted))
        sys.exit(interrupted.exit_code)
    app()


def __getattr__(attribute: str) -> typer.Typer:
    if attribute == "app":
        app = build_app()
        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
