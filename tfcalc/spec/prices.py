"""GPU hourly prices: ``presets/prices.yaml`` (each with its source and date), overridable per run."""

from __future__ import annotations

from dataclasses import dataclass

from tfcalc.errors import SpecError, UsageError


@dataclass(frozen=True, kw_only=True)
class GpuPrice:
    gpu: str
    usd_per_gpu_hour: float
    source: str
    as_of: str


def load_prices() -> dict[str, GpuPrice]:
    """Every price in the preset file, by GPU preset name; one-line SpecError if the file is malformed."""
    from tfcalc.spec.presets import preset_root, read_data_file

    path = preset_root() / "prices.yaml"
    data = read_data_file(path)
    table = data.get("prices")
    if not isinstance(table, dict):
        raise SpecError(f"{path}: expected a mapping 'prices: {{gpu: {{usd_per_gpu_hour: ..., source: ...}}}}'")
    prices: dict[str, GpuPrice] = {}
    for name, entry in table.items():
        if not isinstance(entry, dict):
            raise SpecError(f"{path}: prices.{name} must be a mapping")
        unknown = sorted(set(entry) - {"usd_per_gpu_hour", "source", "as_of"})
        if unknown:
            raise SpecError(f"{path}: prices.{name}: unknown field '{unknown[0]}'")
        value = entry.get("usd_per_gpu_hour")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise SpecError(f"{path}: prices.{name}.usd_per_gpu_hour must be a positive number, got {value!r}")
        if not entry.get("source") or not entry.get("as_of"):
            raise SpecError(f"{path}: prices.{name} needs a source and an as_of date")
        prices[str(name)] = GpuPrice(gpu=str(name), usd_per_gpu_hour=float(value), source=str(entry["source"]),
                                     as_of=str(entry["as_of"]))
    return prices


def parse_price_overrides(values: list[str] | None) -> dict[str, float]:
    """``h100-sxm=2.49`` items (comma lists allowed) -> {gpu: USD per GPU-hour}."""
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
            if not number > 0:
                raise UsageError(f"invalid price '{item}': must be positive")
            out[name] = number
    return out
