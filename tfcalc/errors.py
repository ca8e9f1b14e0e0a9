"""Error types the CLI turns into one-line messages and exit codes (2 = usage, 1 = other failure)."""

from __future__ import annotations


class TfcalcError(Exception):
    """Base class: a failure the user can act on; its message is one line."""

    exit_code = 1


class UsageError(TfcalcError):
    """A bad command-line value: unknown preset or dtype, malformed size, impossible combination."""

    exit_code = 2


class SpecError(TfcalcError):
    """A model or GPU description (preset, user YAML, config.json) that is malformed or cannot exist."""

    exit_code = 1


class OutputError(TfcalcError):
    """The result could not be written."""

    exit_code = 1
