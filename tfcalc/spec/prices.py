"""GPU hourly prices: ``presets/prices.yaml`` (each with its source and date), overridable per run.

Read like every other preset (``tfcalc.spec.presets.read_data_file``: bounded size, no duplicate keys) and checked
field by field with the spec checkers: one-line errors that name the file and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfcalc.errors import SpecError, UsageError

MAX_USD_PER_GPU_HOUR = 10_000.0   # far above any listed GPU: a typo (a price per month) is refused
PRICE_FIELDS = ("usd_per_gpu_hour", "provider_kind", "source", "as_of")
# Who sells at the rate: a GPU cloud (RunPod, Lambda, CoreWeave, Vultr, Akash) or a general-purpose cloud (AWS, Azure,
# Google, Oracle), whose on-demand rate for the same GPU is often 1.5-2x (OCI's GB200 $16.00 against CoreWeave's
# $10.50, presets/prices.yaml gb300); `capacity --price-tier` keeps one kind so that GPUs are compared like with like.
PROVIDER_KINDS = ("neocloud", "hyperscaler")
MAX_TEXT_CHARS = 1000


@dataclass(frozen=True, kw_only=True)
class GpuPrice:
    gpu: str
    usd_per_gpu_hour: float
    provider_kind: str     # one of PROVIDER_KINDS
    source: str
    as_of: str


def prices_from_mapping(data: dict[str, Any], origin: str) -> dict[str, GpuPrice]:
    """Validate ``{prices: {gpu: {usd_per_gpu_hour, provider_kind, source, as_of}}}`` into GpuPrices by GPU name."""
    from tfcalc.spec.model import check_float, check_str, key_text
    from tfcalc.spec.presets import suggest

    def fail(message: str) -> SpecError:
        return SpecError(f"{origin}: {message}")

    unknown = sorted(key_text(k) for k in data if k != "prices")
    if unknown:
        raise fail(f"unknown field '{unknown[0]}' (the file holds one mapping, 'prices')")
    table = data.get("prices")
    if not isinstance(table, dict):
        raise fail("field 'prices' must be a mapping of GPU names to {" + ", ".join(PRICE_FIELDS) + "}")
    prices: dict[str, GpuPrice] = {}
    for name, entry in table.items():
        key = f"prices.{key_text(name)}"
        if not isinstance(name, str):
            raise fail(f"field '{key}': a GPU name must be text")
        if not isinstance(entry, dict):
            raise fail(f"field '{key}' must be a mapping of {', '.join(PRICE_FIELDS)}")
        extra = sorted(key_text(k) for k in entry if k not in PRICE_FIELDS)
        if extra:
            hints = suggest(extra[0], list(PRICE_FIELDS), limit=1)
            raise fail(f"unknown field '{key}.{extra[0]}'" + (f" (did you mean '{key}.{hints[0]}'?)" if hints else ""))
        for field_name in PRICE_FIELDS:
            if entry.get(field_name) is None:
                raise fail(f"missing required field '{key}.{field_name}'")
        try:
            usd = check_float(f"{key}.usd_per_gpu_hour", entry["usd_per_gpu_hour"], MAX_USD_PER_GPU_HOUR)
            kind = check_str(f"{key}.provider_kind", entry["provider_kind"], MAX_TEXT_CHARS)
            source = check_str(f"{key}.source", entry["source"], MAX_TEXT_CHARS)
            as_of = check_str(f"{key}.as_of", entry["as_of"], MAX_TEXT_CHARS)
        except SpecError as exc:
            raise fail(str(exc)) from None
        if kind not in PROVIDER_KINDS:
            raise fail(f"field '{key}.provider_kind' must be one of {', '.join(PROVIDER_KINDS)}, not '{kind}'")
        prices[name] = GpuPrice(gpu=name, usd_per_gpu_hour=usd, provider_kind=kind, source=source, as_of=as_of)
    return prices


def load_prices(path: Path | str | None = None) -> dict[str, GpuPrice]:
    """Every price in ``path`` (default: the bundled presets/prices.yaml), by GPU preset name."""
    from tfcalc.spec.presets import preset_root, read_data_file

    file = Path(path) if path is not None else preset_root() / "prices.yaml"
    return prices_from_mapping(read_data_file(file), str(file))


def parse_price_overrides(values: list[str] | None) -> dict[str, float]:
    """``h100-sxm=2.49`` items (comma lists allowed) -> {gpu: USD per GPU-hour}; a GPU priced twice is an error."""
    from tfcalc.units import split_list

    out: dict[str, float] = {}
    for value in values or []:
        for item in split_list(value):
            name, sep, price = (part.strip() for part in item.partition("="))
            if not sep or not name or not price:
                raise UsageError(f"invalid price '{item}': expected GPU=USD per GPU-hour, e.g. h100-sxm=2.49")
            try:
                number = float(price.lstrip("$"))
            except ValueError:
                raise UsageError(f"invalid price '{item}': '{price}' is not a number") from None
            if not (math.isfinite(number) and 0 < number <= MAX_USD_PER_GPU_HOUR):
                raise UsageError(f"invalid price '{item}': must be positive and at most "
                                 f"{MAX_USD_PER_GPU_HOUR:,.0f} USD per GPU-hour")
            if name in out:
                raise UsageError(f"--price for '{name}' is given twice")
            out[name] = number
    return out
