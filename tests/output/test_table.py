"""The table layout: which columns show, which layout fits a width, and that no cell is ever cut."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from rich.cells import cell_len

from tfcalc.output.columns import Column, format_cell, pick, varies, wide
from tfcalc.output.table import TableView, layout, render_table, select_columns

ROWS = [{"model": "llama3-70b", "batch": 1, "kv_cache_bytes": 40 << 30, "note": "fits on one GPU", "x": None},
        {"model": "llama3-70b", "batch": 8, "kv_cache_bytes": 320 << 30, "note": "fits on one GPU", "x": None}]


def test_select_always_varies_wide_and_keys() -> None:
    columns = pick("model", varies("batch", "note"), "kv_cache_bytes", wide("context"))
    assert [c.key for c in select_columns(ROWS, columns)] == ["model", "batch", "kv_cache_bytes"]  # note is constant
    assert [c.key for c in select_columns(ROWS[:1], columns)] == ["model", "kv_cache_bytes"]  # one row: nothing varies
    wide_view = select_columns([{**r, "context": 8192} for r in ROWS], columns, TableView(wide=True))
    assert [c.key for c in wide_view] == ["model", "batch", "note", "kv_cache_bytes", "context"]
    chosen = select_columns(ROWS, columns, TableView(keys=("kv_cache_bytes", "x", "model")))
    assert [c.key for c in chosen] == ["kv_cache_bytes", "x", "model"]  # as asked, even an empty one
    assert chosen[0] == Column("kv_cache_bytes", "KV cache", "bytes")


def test_a_table_when_it_fits_label_value_pairs_when_one_row_does_not() -> None:
    columns = pick("model", "batch", "kv_cache_bytes", "note")
    cells = [[format_cell(row[c.key], c) for c in columns] for row in ROWS]
    table = layout(columns, cells[:1], 80)
    assert table[0].split() == ["model", "batch", "KV", "cache", "note"]
    assert set(table[1]) == {"─"} and "40.00 GiB" in table[2]
    pairs = layout(columns, cells[:1], 30)
    assert pairs == ["  model     llama3-70b", "  batch     1", "  KV cache  40.00 GiB", "  note      fits on one GPU"]


def test_constant_columns_go_above_the_table_then_rows_become_blocks() -> None:
    columns = pick("model", "batch", "kv_cache_bytes", "note")
    cells = [[format_cell(row[c.key], c) for c in columns] for row in ROWS]
    hoisted = layout(columns, cells, 40)
    assert hoisted[:2] == ["  model  llama3-70b", "  note   fits on one GPU"]
    assert "batch" in hoisted[2] and any("320.00 GiB" in line for line in hoisted)
    blocks = layout(columns, cells, 12)
    assert "row 1 of 2" in blocks and "row 2 of 2" in blocks
    assert "  KV cache  320.00 GiB" in blocks


def test_prose_wraps_between_words_and_headers_stay_whole_words() -> None:
    rows = [{"reason": "weights 65.74 GiB and 13.86 GiB reserved exceed the 79.19 GiB per GPU", "fits": False,
             "max_concurrent_sequences": 0}]
    text = render_table(rows * 2, pick("fits", "max_concurrent_sequences", "reason"), width=40)
    lines = text.splitlines()
    assert max(cell_len(line) for line in lines) <= 40
    assert all(word in text for word in rows[0]["reason"].split())
    assert "65.74" in text and "max" in lines[0]


def test_notes_wrap_at_the_width_and_never_split_a_word() -> None:
    note = "GiB = 2^30 bytes; " * 10 + "131,072"
    text = render_table(ROWS, pick("model"), "Title", (note,), width=40)
    assert all(cell_len(line) <= 40 for line in text.splitlines()) and "131,072" in text


def test_a_verbatim_note_keeps_its_lines() -> None:
    """A shell command (continuation lines, a flag wider than the terminal) prints as written: re-wrapping it
    would break the command."""
    from tfcalc.output import Verbatim

    command = "vllm serve org/model \\\n         --speculative-config '" + '{"method": "eagle"}' * 4 + "'"
    text = render_table([{"model": "m"}], pick("model"), notes=("a note " * 20, Verbatim(command)), width=40)
    lines = text.splitlines()
    assert lines[-2:] == command.splitlines() and cell_len(lines[-1]) > 40
    assert all(cell_len(line) <= 40 for line in lines[:-1])


def test_natural_width_without_a_width() -> None:
    rows = [{"model": "m" * 150, "kv_cache_bytes": 1 << 30}]
    text = render_table(rows, pick("model", "kv_cache_bytes"))
    assert ("m" * 150 + "  1.00 GiB") in text  # no width: one line, as wide as it takes


_NUMERIC = pick("batch", "kv_cache_bytes", "ttft_s", "decode_tokens_per_s", "hbm_bandwidth_bytes_per_s",
                "share_of_total", "total_params")
_values = st.fixed_dictionaries({
    "model": st.from_regex(r"[a-z][a-z0-9.\-]{0,24}", fullmatch=True),
    "batch": st.integers(1, 10**6), "kv_cache_bytes": st.integers(0, 1 << 45),
    "ttft_s": st.floats(1e-7, 1e4), "decode_tokens_per_s": st.floats(0, 1e7),
    "hbm_bandwidth_bytes_per_s": st.floats(1e6, 1e16), "share_of_total": st.floats(0, 1),
    "total_params": st.integers(1, 10**13),
    "note": st.lists(st.from_regex(r"[a-z0-9,.()%]{1,12}", fullmatch=True), max_size=12).map(" ".join),
})


@given(rows=st.lists(_values, min_size=1, max_size=6), width=st.integers(24, 200))
def test_no_cell_is_ever_cut_at_any_width(rows: list[dict], width: int) -> None:
    """Whatever the values and the width: every number and identifier whole on one line, every word of prose
    kept, no ellipsis, and no line wider than the width unless a label/value line alone is (labels aligned)."""
    columns = [*pick("model"), *_NUMERIC, *pick("note")]
    text = render_table(rows, columns, "Title", ("a note " * 20,), width=width)
    lines = text.splitlines()
    assert "…" not in text
    for row in rows:
        for c in columns:
            cell = format_cell(row[c.key], c)
            if c.wraps:
                assert all(any(word in line for line in lines) for word in cell.split())
            else:
                assert any(cell in line for line in lines), (c.key, cell)
    longest_pair = 4 + max(cell_len(c.header) for c in columns) + max(
        cell_len(format_cell(row[c.key], c)) for row in rows for c in columns if not c.wraps)
    assert all(cell_len(line) <= max(width, longest_pair) for line in lines)


@given(st.lists(st.text(alphabet="abcdefgh ", min_size=1, max_size=300).map(str.strip).filter(bool), min_size=1,
                max_size=5), st.integers(0, 6))
def test_explanation_lines_fit_80_columns_and_keep_every_word(lines: list[str], indent: int) -> None:
    """output.explanation_lines: every line of --explain's trace within 80 columns (a word longer than the line
    excepted), two spaces plus the line's own indent in front, its continuations four further in, no word lost."""
    from tfcalc.output import explanation_lines

    text = explanation_lines(" " * indent + line for line in lines)
    assert text.endswith("\n") and text.split() == " ".join(lines).split()
    for out in text.splitlines():
        assert len(out) <= 80 or len(out.split()) == 1
        assert out.startswith(" " * (2 + indent))


@given(st.lists(st.text("abcXYZ_0", min_size=1, max_size=40), min_size=2, max_size=8), st.integers(4, 60))
def test_a_dotted_field_wraps_after_its_dots_and_keeps_every_character(parts: list[str], width: int) -> None:
    """A prose cell without spaces but with dots (a preset field: kernels.moe_by_architecture.b200.KimiK3...)
    breaks after a dot where one falls inside the width, else anywhere: every line fits, nothing is lost."""
    from tfcalc.output.table import _wrap

    text = ".".join(parts)
    lines = _wrap(text, width)
    assert "".join(lines) == text and all(len(line) <= width for line in lines)
    assert all(line.endswith(".") or len(line) == width for line in lines[:-1])


def test_presets_show_fits_80_columns_with_an_architecture_key() -> None:
    """`presets show vllm-0.21` at 80 columns: the Kimi K3 entry's 80-character field names wrap after a dot."""
    from tfcalc.cli.presets import SHOW_COLUMNS
    from tfcalc.report.presets import preset_field_rows

    rows = preset_field_rows("engine", "vllm-0.21")
    lines = render_table(rows, SHOW_COLUMNS, width=80).splitlines()
    assert all(cell_len(line) <= 80 for line in lines)
    assert any(line.startswith("kernels.moe_by_architecture.b200.") for line in lines)
