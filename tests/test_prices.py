"""Prices: each fabric's fixed cost only with its tier, and a user's prices file checked."""

from __future__ import annotations

import pytest

from kvtier.errors import InputError
from kvtier.hardware import load_hardware
from kvtier.hardware.prices import apply_prices, load_prices


def test_fabric_costs_belong_to_the_tier_that_needs_them() -> None:
    hw = load_hardware("beluga-testbed")
    base = hw.cost_per_hour(2)
    gpus = 2 * hw.topology.tp
    assert base == pytest.approx(gpus * hw.gpu.price_per_hour)  # no tier: no NIC, no adapter
    cxl = hw.cost_per_hour(2, {"cxl": 100.0}) - base
    rdma = hw.cost_per_hour(2, {"rdma": 100.0}) - base
    hosts = -(-gpus // hw.topology.gpus_per_host)
    assert cxl == pytest.approx(100 * 7.5e-4 + hosts * 0.095)
    assert rdma == pytest.approx(100 * 5.7e-4 + hosts * 0.43)


def test_prices_file_replaces_the_profile_prices(tmp_path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        'basis = "cloud"\ngpu_per_hour = 2.0\n[tiers.dram]\nper_gb_hour = 0.001\n'
        "fabric_per_host_hour = 0.5\n"
    )
    hw = apply_prices(load_hardware("h100-node"), load_prices(path))
    assert hw.cost_per_hour(8, {"dram": 1000.0}) == pytest.approx(16.0 + 1.0 + 0.5)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gpu_price = 2\n", "unknown key(s) ['gpu_price']"),
        ('basis = "rented"\n', "must be one of owned, cloud"),
        ("[tiers.hbm]\nper_gb_hour = 1\n", "unknown tier 'hbm'"),
        ("[tiers.dram]\nprice = 1\n", "unknown key(s) ['price']"),
        ("gpu_per_hour = -1\n", "must be >= 0"),
    ],
)
def test_bad_prices_file_is_one_line(tmp_path, text, needle) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_prices(path)
    assert needle in str(err.value) and "\n" not in str(err.value)
