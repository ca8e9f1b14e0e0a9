"""Text that is safe to print on a terminal, and ASCII stand-ins for streams that cannot encode Unicode.

A model name, a YAML field or a file name can carry escape sequences (``\\x1b]0;title\\x07`` retitles a
terminal, ``\\x1b[2J`` clears it) or C1 controls (``\\x9b`` is CSI on some terminals). ``printable`` removes
whole escape sequences, then every other control character (Unicode category Cc) and the bidirectional
overrides that can make text read differently from what it is (the "Trojan Source" characters, CVE-2021-42574).
"""

from __future__ import annotations

import functools
import re

_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """(escape sequences, controls but newline, controls and newline), compiled on first use."""
    # ESC-introduced sequences (ECMA-48): CSI ... final byte, OSC/DCS/SOS/PM/APC ... BEL or ST, ESC + one byte;
    # and the 8-bit CSI.
    escape = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b[\]PX^_].*?(?:\x07|\x1b\\|$)|\x1b.?|\x9b[0-?]*[ -/]*[@-~]?",
                        re.DOTALL)
    control = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f" + _BIDI + "]")
    control_or_newline = re.compile("[\x00-\x1f\x7f-\x9f" + _BIDI + "]")
    return escape, control, control_or_newline


# Typographic characters tfcalc prints, for ASCII-only streams (box drawing is mapped by name, see to_ascii).
_TYPOGRAPHIC = {"\u2014": "-", "\u2013": "-", "\u2212": "-", "\u00b5": "u", "\u03bc": "u", "\u2026": "...",
                "\u00d7": "x", "\u2248": "~", "\u2264": "<=", "\u2265": ">=", "\u00b7": ".", "\u2192": "->",
                "\u00a0": " "}


def printable(text: str, one_line: bool = False) -> str:
    """``text`` without escape sequences, control characters (tabs become spaces) or bidi overrides.

    Newlines are kept unless ``one_line``, which turns each line break into a space.
    """
    if text.isprintable():  # no Cc, no Cf (bidi overrides are Cf), no line break: nothing to remove
        return text
    escape, control, control_or_newline = _patterns()
    text = escape.sub("", text).replace("\t", " ")
    if one_line:
        text = text.replace("\r\n", "\n").replace("\n", " ")
        return control_or_newline.sub("", text)
    return control.sub("", text)


def has_unsafe_characters(text: str) -> bool:
    """Whether ``printable`` would change ``text`` (newlines allowed)."""
    return _patterns()[1].search(text) is not None


@functools.cache
def _ascii_table() -> dict[int, str]:
    """U+2500..U+257F by name: lines -> '-' ('=' if double) or '|'; corners, joints and crossings (" AND ") -> '+'."""
    import unicodedata

    table: dict[int, str] = {ord(k): v for k, v in _TYPOGRAPHIC.items()}
    for code in range(0x2500, 0x2580):
        words = unicodedata.name(chr(code), "").split()
        if "AND" in words or "DIAGONAL" in words:
            table[code] = "+"
        elif {"HORIZONTAL", "LEFT", "RIGHT"} & set(words):
            table[code] = "=" if "DOUBLE" in words else "-"
        else:
            table[code] = "|"
    return table


def to_ascii(text: str) -> str:
    """Box drawing and typographic characters replaced by ASCII look-alikes; anything else left as is."""
    return text.translate(_ascii_table())


def can_encode(text: str, encoding: str | None) -> bool:
    if not encoding:
        return True
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True
