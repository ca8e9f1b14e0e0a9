"""Size and list parsing."""

from __future__ import annotations

import pytest

from tfcalc.errors import UsageError
from tfcalc.units import parse_size, parse_sizes


@pytest.mark.parametrize("text, value", [
    ("131072", 131_072), ("128k", 131_072), ("128K", 131_072), ("1m", 1_048_576), ("1M", 1_048_576),
    ("1_000", 1000), ("4k", 4096), ("1.5k", 1536), (" 32k ", 32_768),
])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text, message", [
    ("0", "must be positive"), ("-4", "must be positive"), ("-0", "must be positive"), ("-1.5k", "must be positive"),
    ("12q", "expected an integer"), ("", "expected"), ("1.3", "whole number"), ("k", "expected an integer"),
])
def test_parse_size_rejects(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_size(text, "context")


def test_parse_sizes_lists_keep_order_and_drop_duplicates() -> None:
    assert parse_sizes(["4k,32k", "128k", "4096"], "context") == [4096, 32_768, 131_072]
    with pytest.raises(UsageError, match="invalid context '4k,,8k': empty item"):
        parse_sizes(["4k,,8k"], "context")
    with pytest.raises(UsageError, match="invalid batch '': empty"):  # names the option, not "invalid list"
        parse_sizes([""], "batch")


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400"])
def test_parse_float_refuses_non_finite(text: str) -> None:
    from tfcalc.units import parse_float

    with pytest.raises(UsageError, match="finite"):
        parse_float(text, "efficiency", 0.0, 1.0)


def test_parse_size_is_exact_and_bounded() -> None:
    from tfcalc.units import MAX_SIZE

    assert parse_size("9007199254740993") == 9_007_199_254_740_993
    assert parse_size(str(MAX_SIZE)) == MAX_SIZE
    for text in (str(MAX_SIZE + 1), "9" * 401, "1." + "0" * 80 + "1k"):
        with pytest.raises(UsageError, match="at most"):
            parse_size(text, "batch")


def test_format_count_is_singular_only_for_one() -> None:
    from tfcalc.units import format_count

    assert [format_count(n, "GPU") for n in (0, 1, 2, 1024)] == ["0 GPUs", "1 GPU", "2 GPUs", "1,024 GPUs"]
