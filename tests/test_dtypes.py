"""Storage formats by name and alias."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tfcalc.dtypes import ALIASES, DTYPES, generic_name, get_dtype
from tfcalc.errors import UsageError


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_every_alias_names_its_format(alias: str) -> None:
    """Each alias resolves as written, upper-cased and with '-' and '_' swapped (mxfp4-e2m1 could never match
    once names were normalised to underscores and the alias table was not)."""
    target = DTYPES[ALIASES[alias]]
    for spelling in (alias, alias.upper(), alias.replace("-", "_"), alias.replace("_", "-")):
        if spelling.lower().startswith("int4"):
            continue
        assert get_dtype(spelling) == target, spelling


def test_names_and_int4_groups() -> None:
    assert get_dtype("mxfp4-e2m1").bits_per_element == Fraction(17, 4)  # 4 + 8/32
    assert get_dtype("FP8-E4M3") is DTYPES["fp8_e4m3"] and get_dtype("int4").name == "int4-g128"
    assert get_dtype("int4-g32").bits_per_element == Fraction(4) + Fraction(20, 32)
    # GPTQ 8-bit groups: an fp16 scale and an 8-bit zero per group; plain int8 stays per channel
    assert get_dtype("INT8-G128").name == "int8-g128" and get_dtype("int8-g128").whole_blocks == (1, 128)
    assert get_dtype("int8-g128").bits_per_element == Fraction(8) + Fraction(24, 128)
    assert get_dtype("int8").bits_per_element == 8 and get_dtype("nf4").bits_per_element == Fraction(9, 2)
    # symmetric groups (compressed-tensors stores no zero point for them): the 16-bit scale alone
    assert get_dtype("INT4-G32-SYM").name == "int4-g32-sym" and get_dtype("int4-g32-sym").whole_blocks == (1, 32)
    assert get_dtype("int4-g32-sym").bits_per_element == Fraction(9, 2)
    assert get_dtype("int8-g128-sym").bits_per_element == Fraction(8) + Fraction(16, 128)
    with pytest.raises(UsageError, match="unknown dtype 'int4-g32-asym'"):
        get_dtype("int4-g32-asym")
    # the family an engine lists (weights.unsupported): the group size as N
    assert [generic_name(n) for n in ("int4-g32-sym", "int8-g128", "nvfp4", "fp8_block")] == [
        "int4-gN-sym", "int8-gN", "nvfp4", "fp8_block"]
    with pytest.raises(UsageError, match="ambiguous dtype 'fp4'"):
        get_dtype("fp4")
    with pytest.raises(UsageError, match="unknown dtype 'fp9'"):
        get_dtype("fp9")


@pytest.mark.parametrize("name", ["int4-g7", "int4-g0", "int4-g4", "int4-g16384", "int4-g99999999999999", "int8-g24"])
def test_int4_groups_are_powers_of_two_from_8(name: str) -> None:
    with pytest.raises(UsageError, match="group size must be a power of two from 8 to 8,192"):
        get_dtype(name)
    assert get_dtype("int4-g8").block_size == 8 and get_dtype("int4-g8192").block_size == 8192
