"""GPU prices: the bundled file loads, and a malformed one is refused in one line naming the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tfcalc.errors import SpecError, UsageError
from tfcalc.spec.presets import preset_names
from tfcalc.spec.prices import PROVIDER_KINDS, load_prices, parse_price_overrides

GOOD = "prices:\n  h100-sxm: {usd_per_gpu_hour: 2.5, provider_kind: neocloud, source: a listing, as_of: '2026-01-01'}\n"


def test_bundled_prices_name_gpu_presets_with_sources() -> None:
    prices = load_prices()
    assert prices and set(prices) <= set(preset_names("gpu"))
    for p in prices.values():
        assert 0 < p.usd_per_gpu_hour < 100 and p.source and p.as_of and p.provider_kind in PROVIDER_KINDS


@pytest.mark.parametrize("text,message", [
    (GOOD.replace("2.5", "-1"), "field 'prices.h100-sxm.usd_per_gpu_hour' must be positive"),
    (GOOD.replace("2.5", "1.0e+9"), "field 'prices.h100-sxm.usd_per_gpu_hour' must be at most"),
    (GOOD.replace("2.5", ".nan"), "must be a finite number"),
    (GOOD.replace("2.5", "true"), "must be a number"),
    (GOOD.replace("usd_per_gpu_hour", "usd_per_gpu_hr"),
     "unknown field 'prices.h100-sxm.usd_per_gpu_hr' (did you mean"),
    (GOOD.replace(", as_of: '2026-01-01'", ""), "missing required field 'prices.h100-sxm.as_of'"),
    (GOOD.replace("'2026-01-01'", "2026-01-01"), "field 'prices.h100-sxm.as_of' must be text"),
    (GOOD + "extra: 1\n", "unknown field 'extra'"),
    ("prices: [1, 2]\n", "field 'prices' must be a mapping"),
    ("prices:\n  h100-sxm: 2.5\n", "field 'prices.h100-sxm' must be a mapping"),
    (GOOD + "  h100-sxm: {usd_per_gpu_hour: 3, source: b, as_of: c}\n", "duplicate key 'h100-sxm'"),
    (GOOD.replace("neocloud", "aws"), "field 'prices.h100-sxm.provider_kind' must be one of neocloud, hyperscaler, "
                                      "not 'aws'"),
    (GOOD.replace(" provider_kind: neocloud,", ""), "missing required field 'prices.h100-sxm.provider_kind'"),
    (GOOD.replace("provider_kind", "provider_type"), "unknown field 'prices.h100-sxm.provider_type' (did you mean"),
])
def test_malformed_prices_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_prices(path)
    assert message in str(err.value) and str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_good_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(GOOD)
    assert load_prices(path)["h100-sxm"].usd_per_gpu_hour == 2.5
    assert parse_price_overrides(["h100-sxm=$2.49,a100-80gb=1.5"]) == {"h100-sxm": 2.49, "a100-80gb": 1.5}
    for bad in ("h100-sxm", "h100-sxm=abc", "h100-sxm=0", "h100-sxm=inf", "h100-sxm=1e6", "h200=2,h200=3"):
        with pytest.raises(UsageError):
            parse_price_overrides([bad])


def test_new_parts_prices_follow_their_sources() -> None:
    """RunPod's per-second active rate x 3,600 (the L40 shares the L40/L40S pool line); AWS's hourly g5.xlarge rate."""
    prices = load_prices()
    assert prices["l40"].usd_per_gpu_hour == pytest.approx(0.00037 * 3600) == prices["l40s"].usd_per_gpu_hour
    assert prices["a10g"].usd_per_gpu_hour == 1.006 and "g5.xlarge" in prices["a10g"].source
    for gpu, per_second, pool in (("rtx-a6000", 0.00024, '"A6000, A40"'), ("a40", 0.00024, '"A6000, A40"'),
                                  ("rtx6000-ada", 0.00037, '"L40, L40S, 6000 Ada PRO"')):
        price = prices[gpu]
        assert price.usd_per_gpu_hour == pytest.approx(per_second * 3600)
        assert pool in price.source and f"${per_second:.5f}/s" in price.source


# Each rate as its source states it (the figure, the text the entry quotes it by, the GPUs it covers): the entry's
# price is that figure / those GPUs, its source names the page and its as_of the date the page was read.
SOURCE_RATES = [
    ("h100-pcie", 2.89, "$2.89/hr", 1, "runpod.io/pricing", "2026-11-09"),        # RunPod Pods, Secure Cloud
    ("b300", 7.89, "$7.89/hr", 1, "runpod.io/pricing", "2026-10-07"),             # RunPod Pods
    ("a100-40gb", 1.99, "$1.99 per GPU per hour", 1, "lambda.ai/instances", "2026-09-20"),
    ("a10", 1.29, "$1.29 per GPU per hour", 1, "lambda.ai/instances", "2026-09-20"),
    ("rtx5090", 0.67, "$0.67/hr", 1, "akash.network/pricing/gpus", "2026-09-20"),
    ("gb200", 42.00, "$42.00/hr for 4 GPUs", 4, "coreweave.com/pricing", "2026-09-20"),  # one 4-GPU tray of an NVL72
    ("mi325x", 2.000, "$2.000 per GPU/hr", 1, "vultr.com/pricing", "2026-09-26"),  # Vultr, 8-GPU VM
    ("mi300x", 1.850, "$1.850 per GPU/hr", 1, "vultr.com/pricing", "2026-09-26"),  # Vultr, 8-GPU VM
    ("gh200", 2.29, "$2.29 per GPU per hour", 1, "lambda.ai/instances", "2026-09-20"),  # Lambda "1x NVIDIA GH200"
    ("gb300", 18.00, '$18.00 per "GPU Per Hour"', 1, "oracle.com/cloud/price-list", "2026-09-19"),  # OCI B112140
    ("mi355x", 2.590, "$2.590 per GPU/hr", 1, "vultr.com/pricing", "2026-09-26"),  # Vultr, 8-GPU VM
]


@pytest.mark.parametrize("gpu,rate,quoted,gpus,page,date", SOURCE_RATES)
def test_added_prices_are_their_sources_rate_per_gpu(gpu: str, rate: float, quoted: str, gpus: int, page: str,
                                                      date: str) -> None:
    price = load_prices()[gpu]
    assert price.usd_per_gpu_hour == pytest.approx(rate / gpus)
    assert quoted in price.source and page in price.source and price.as_of == date


def test_mi355x_rents_as_an_8_gpu_vm_and_gb300_at_ocis_rate() -> None:
    """Vultr sells the MI355X only as 8 GPUs ($20.72 an hour for the VM, the zerv report's figure, = 8 x $2.59); OCI's
    GB300 rate is its GB200 one ($16.00, quoted beside it) + $2.00, and above CoreWeave's GB200 rate."""
    prices = load_prices()
    assert prices["mi355x"].usd_per_gpu_hour * 8 == pytest.approx(20.72)
    assert "8 GPUs" in prices["mi355x"].source and "$8.60" in prices["mi355x"].source
    assert prices["gb300"].usd_per_gpu_hour - 16.00 == pytest.approx(2.00) and "$16.00" in prices["gb300"].source
    assert prices["gb300"].usd_per_gpu_hour > prices["gb200"].usd_per_gpu_hour


def test_the_trailing_comment_names_exactly_the_unpriced_gpus() -> None:
    """The comment after the last entry lists every GPU preset without a price, and no priced one."""
    from tfcalc.spec.presets import preset_root

    text = (preset_root() / "prices.yaml").read_text()
    comment = " ".join(line.strip(" #") for line in text.rsplit("as_of:", 1)[1].splitlines()[1:])
    named = set(re.split(r",\s*|\s+and\s+", comment.split(" have no price")[0].strip()))
    assert named == set(preset_names("gpu")) - set(load_prices()) == {"mi350x", "h20", "gh200-144gb"}


# Who sells at each rate: the general-purpose clouds' (AWS, Azure, Google, Oracle) are hyperscaler rates, the GPU
# clouds' (RunPod, Lambda, CoreWeave, Vultr, Akash) neocloud ones; the seller named first in each source decides.
HYPERSCALERS = ("AWS", "Azure", "Google Cloud", "Oracle Cloud")
NEOCLOUDS = ("RunPod", "Lambda", "CoreWeave", "Vultr", "Akash")


def test_provider_kind_follows_the_seller_the_source_names_first() -> None:
    for gpu, price in load_prices().items():
        sellers = {name: price.source.find(name) for name in HYPERSCALERS + NEOCLOUDS if name in price.source}
        first = min(sellers, key=sellers.__getitem__)
        assert price.provider_kind == ("hyperscaler" if first in HYPERSCALERS else "neocloud"), gpu
    assert {g for g, p in load_prices().items() if p.provider_kind == "hyperscaler"} == {"a10g", "gb300"}


def test_amd_parts_are_priced_by_one_seller() -> None:
    """MI300X, MI325X and MI355X all at Vultr's on-demand 8-GPU VM rates (one page, read 2026-09-26), so the three
    compare like with like; the MI325X's DigitalOcean rate ($3.80) is quoted beside it, not used."""
    prices = load_prices()
    for gpu in ("mi300x", "mi325x", "mi355x"):
        assert prices[gpu].source.startswith("Vultr Cloud GPU") and "8 GPUs" in prices[gpu].source
        assert prices[gpu].as_of == "2026-09-26"
    assert prices["mi300x"].usd_per_gpu_hour < prices["mi325x"].usd_per_gpu_hour < prices["mi355x"].usd_per_gpu_hour
    assert "$3.80" in prices["mi325x"].source
