"""Rows -> text a person reads, fitted to a width with every cell whole (the only module that lays out tables).

``render_table`` shows the columns ``select_columns`` picks, in the first layout that fits ``width``:

1. one table, its headers wrapped between words and its prose cells (notes, sources) between words if needed;
2. with several rows, the columns that hold the same value in every row as label/value pairs, above a table of
   the columns that differ;
3. label/value pairs: one block for a single row, one block per row otherwise.

Numbers and identifiers are never wrapped, cut or shortened: a value wider than the whole width stays on one line
(the terminal wraps it, nothing is lost). ``width`` None means the natural width (pipes and files).
"""

from __future__ import annotations

import collections
import functools
import textwrap

from tfcalc.output import Verbatim
from tfcalc.output.columns import DEFAULT_VIEW, Column, TableView, column, format_cell
from tfcalc.output.terminal import printable

GAP = 2  # spaces between two columns of a table
# A prose column is as wide as its longest word, at least PROSE_MIN and at most PROSE_WORD_MAX (longer words
# break), unless its cells are all narrower.
PROSE_MIN, PROSE_WORD_MAX = 10, 16
INDENT = 2  # label/value pairs sit under the title
MIN_NOTE_WIDTH = 100  # notes under a table drawn at its natural width wrap at this width or the table's


def select_columns(rows: list[dict[str, object]], columns: list[Column], view: TableView = DEFAULT_VIEW
                   ) -> list[Column]:
    """The columns to show. ``keys`` wins (each as the command declares it, else as registered); otherwise a
    column with no value in any row (e.g. datasheet MFU on a CPU) is left out, ``wide`` columns need
    ``view.wide`` and ``varies`` columns need two rows that differ; ``view.wide`` adds every other key of the
    rows after the declared columns."""
    if view.keys:
        declared = {c.key: c for c in columns}
        return [(declared.get(k) or _registered(k))._replace(show="always") for k in view.keys]
    if not rows:
        return [c for c in columns if c.show == "always"]
    if view.wide:
        declared_keys = {c.key for c in columns}
        columns = [*columns, *(_registered(k) for k in dict.fromkeys(k for row in rows for k in row)
                               if k not in declared_keys)]
    shown = []
    for c in columns:
        values = [row.get(c.key) for row in rows]
        if all(v is None for v in values):
            continue
        if view.wide or c.show == "always" or (c.show == "varies" and len({format_cell(v, c) for v in values}) > 1):
            shown.append(c)
    return shown


def _registered(key: str) -> Column:
    try:
        return column(key)
    except KeyError:
        return Column(key, key)


def _width(text: str) -> int:
    from rich.cells import cell_len

    return cell_len(text)


def _longest_word(text: str) -> int:
    return max((_width(word) for word in text.split()), default=0)


def _fit(columns: list[Column], cells: list[list[str]], width: int | None) -> list[int] | None:
    """Column widths that show every cell whole within ``width``, or None. Headers may wrap between words, prose
    cells too; the columns left over go where they save the most lines (``_height``)."""
    count = len(columns)
    chrome = GAP * (count - 1)
    longest = [max((_width(row[i]) for row in cells), default=0) for i in range(count)]
    natural = [max(longest[i], _width(c.header), 1) for i, c in enumerate(columns)]
    if width is None or sum(natural) + chrome <= width:
        return natural
    prose = [i for i, c in enumerate(columns) if c.wraps]
    minimum = [max(_prose_minimum(cells, i, longest[i]) if i in prose else longest[i], _longest_word(c.header), 1)
               for i, c in enumerate(columns)]
    spare = width - chrome - sum(minimum)
    if spare < 0:
        return None
    widths = list(minimum)
    texts = [sorted({row[i] for row in cells}) if i in prose else [] for i in range(count)]
    body = collections.Counter(tuple(row[i] for i in prose) for row in cells)  # rows alike wrap alike
    height = _height(columns, widths, prose, body)
    while spare > 0:  # widen the column that saves the most lines per column spent, until none saves any
        best: tuple[float, int, int, int] | None = None
        for i in range(count):
            for w in range(widths[i] + 1, min(natural[i], widths[i] + spare) + 1):
                if not (_lines(columns[i].header, w) < _lines(columns[i].header, w - 1)
                        or any(_lines(t, w) < _lines(t, w - 1) for t in texts[i])):
                    continue  # nothing in this column gets shorter at this width
                trial = widths[:i] + [w] + widths[i + 1:]
                saved = height - _height(columns, trial, prose, body)
                if saved > 0 and (best is None or saved / (w - widths[i]) > best[0]):
                    best = (saved / (w - widths[i]), i, w, height - saved)
        if best is None:
            break
        _, i, w, height = best
        spare -= w - widths[i]
        widths[i] = w
    return widths


def _wrap(text: str, width: int) -> list[str]:
    """``text`` wrapped between words at ``width``; a word longer than ``width`` is broken, after one of its dots
    where it has them (a dotted preset field, ``kernels.moe_by_architecture.b200...``), else anywhere (prose only:
    numbers and identifiers never reach here, and headers are never narrower than their longest word)."""
    if " " in text or "." not in text or len(text) <= width:
        return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]
    *heads, tail = text.split(".")
    lines, line = [], ""
    for part in [head + "." for head in heads] + [tail]:
        if line and len(line) + len(part) > width:
            lines.append(line)
            line = ""
        line += part
        while len(line) > width:  # one part wider than the column: broken anywhere
            lines.append(line[:width])
            line = line[width:]
    return [*lines, line] if line else lines


def _prose_minimum(cells: list[list[str]], i: int, longest: int) -> int:
    word = max((_longest_word(row[i]) for row in cells), default=0)
    return min(longest, max(min(word, PROSE_WORD_MAX), PROSE_MIN))


@functools.lru_cache(maxsize=4096)
def _lines(text: str, width: int) -> int:
    return len(_wrap(text, width))


def _height(columns: list[Column], widths: list[int], prose: list[int], body: collections.Counter) -> int:
    """Lines the table takes: its tallest header, then each row's tallest prose cell (``body``: the rows' prose
    cells, counted)."""
    header = max(_lines(c.header, w) for c, w in zip(columns, widths, strict=True))
    return header + sum(n * max((_lines(text, widths[i]) for text, i in zip(texts, prose, strict=True)), default=1)
                        for texts, n in body.items())


def _draw(columns: list[Column], cells: list[list[str]], widths: list[int]) -> list[str]:
    """Header (wrapped, bottom-aligned), a rule, then the rows (prose wrapped, top-aligned); numbers right-aligned,
    columns GAP apart. Drawn here, not by Rich: the layout is already decided, and the CLI starts faster without
    importing Rich's console and table."""

    def line(parts: list[str]) -> str:
        return (" " * GAP).join(_pad(part, c, w) for part, c, w in zip(parts, columns, widths, strict=True)).rstrip()

    def block(texts: list[list[str]], bottom: bool) -> list[str]:
        height = max(len(t) for t in texts)
        padded = [([""] * (height - len(t)) + t) if bottom else (t + [""] * (height - len(t))) for t in texts]
        return [line([t[k] for t in padded]) for k in range(height)]

    lines = block([_wrap(c.header, w) for c, w in zip(columns, widths, strict=True)], bottom=True)
    lines.append("─" * (sum(widths) + GAP * (len(widths) - 1)))
    for row in cells:
        lines += block([_wrap(cell, w) if c.wraps else [cell] for c, cell, w in zip(columns, row, widths, strict=True)],
                       bottom=False)
    return lines


def _pad(text: str, column: Column, width: int) -> str:
    space = " " * max(width - _width(text), 0)
    return space + text if column.numeric else text + space


def _pairs(columns: list[Column], values: list[str], label_width: int, width: int | None) -> list[str]:
    """``label  value`` lines; prose wraps between words under itself (under the label when the value column is
    too narrow), other values stay whole."""
    lines = []
    room = None if width is None else width - INDENT - label_width - GAP
    for c, value in zip(columns, values, strict=True):
        label = f"{' ' * INDENT}{c.header}{' ' * (label_width - _width(c.header))}{' ' * GAP}"
        if not c.wraps or room is None or _width(value) <= room:
            lines.append((label + value).rstrip())
        elif room >= PROSE_MIN:
            first, *rest = _wrap(value, room)
            lines += [label + first, *(" " * len(label) + part for part in rest)]
        else:
            lines += [label.rstrip(), *(" " * 2 * INDENT + part for part in _wrap(value, max(width - 2 * INDENT, 1)))]
    return lines


def layout(columns: list[Column], cells: list[list[str]], width: int | None) -> list[str]:
    """The body of a table (no title, no notes) in the first layout that fits: see the module docstring."""
    widths = _fit(columns, cells, width)
    if widths is not None:
        return _draw(columns, cells, widths)
    label_width = max(_width(c.header) for c in columns)
    if len(cells) == 1:
        return _pairs(columns, cells[0], label_width, width)
    same = [i for i in range(len(columns)) if len({row[i] for row in cells}) == 1]
    differ = [i for i in range(len(columns)) if i not in same]
    rest = [columns[i] for i in differ]
    rest_cells = [[row[i] for i in differ] for row in cells]
    widths = _fit(rest, rest_cells, width) if same and differ else None
    if widths is not None:
        common = [columns[i] for i in same]
        return _pairs(common, [cells[0][i] for i in same], max(_width(c.header) for c in common), width) + _draw(
            rest, rest_cells, widths)
    lines = _pairs([columns[i] for i in same], [cells[0][i] for i in same], label_width, width)
    for number, row in enumerate(rest_cells, 1):
        lines.append(f"row {number} of {len(rest_cells)}")
        lines += _pairs(rest, row, label_width, width)
    return lines


def render_table(rows: list[dict[str, object]], columns: list[Column], title: str = "", notes: tuple[str, ...] = (),
                 width: int | None = None, view: TableView = DEFAULT_VIEW) -> str:
    """Title, body (``layout``) and notes as plain text. Cells are made printable (escape sequences and control
    characters removed) and never parsed as markup; notes wrap between words at ``width`` (with no width: at
    the body's width, at least MIN_NOTE_WIDTH), except ``Verbatim`` ones."""
    shown = select_columns(rows, columns, view)
    cells = [[printable(format_cell(row.get(c.key), c), one_line=True) for c in shown] for row in rows]
    title = printable(title, one_line=True)
    lines = (textwrap.wrap(title, width, break_long_words=False) if width else [title]) if title else []
    if shown:
        lines += layout(shown, cells, width)
    note_width = width or max(MIN_NOTE_WIDTH, *(_width(line) for line in lines)) if lines else MIN_NOTE_WIDTH
    for note in notes:
        if isinstance(note, Verbatim):  # a command line: as written, a line wider than the width left whole
            lines += printable(note).splitlines()
            continue
        for paragraph in printable(note).splitlines() or [""]:
            lines += textwrap.wrap(paragraph, note_width, break_long_words=False, break_on_hyphens=False) or [""]
    return "".join(line + "\n" for line in lines)
