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
    ("0", "must be positive"), ("-4", "expected an integer"), ("12q", "expected an integer"), ("", "expected"),
    ("1.3", "whole number"), ("k", "expected an integer"),
])
def test_parse_size_rejects(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_size(text, "context")


def test_parse_sizes_lists_keep_order_and_drop_duplicates() -> None:
    assert parse_sizes(["4k,32k", "128k", "4096"], "context") == [4096, 32_768, 131_072]
    with pytest.raises(UsageError, match="empty item"):
        parse_sizes(["4k,,8k"], "context")
