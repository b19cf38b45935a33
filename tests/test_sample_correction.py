"""The sample-correction rules on plain values (kvtier.trace.sample_correction): the instance
count a sample replays on, the share of per-host pools its hosts keep, and when the routing
fan-out is restored or a bias is reported."""

from __future__ import annotations

import pytest

from kvtier.errors import InputError
from kvtier.policy.registries import content_blind_routers
from kvtier.trace.sample_correction import (
    fan_out_applies,
    host_share,
    sample_bias,
    sample_instances,
)


def test_a_sample_replays_on_its_fraction_of_the_instances() -> None:
    assert sample_instances(40, 0.1) == 4
    assert sample_instances(8, 0.25) == 2
    with pytest.raises(InputError) as err:
        sample_instances(8, 0.3)  # 2.4 instances
    assert "multiple of 10" in str(err.value) and "kvtier.sample_fraction" in str(err.value)
    with pytest.raises(InputError):
        sample_instances(2, 0.25)  # half an instance


def test_per_host_pools_shrink_to_the_hosts_the_sample_fills() -> None:
    # 40 instances on 8-per-host hosts fill 5 hosts; the 0.1 sample's 4 fill one host, which
    # then keeps half its pool so that the sample holds 0.1 of the 5 hosts' pools
    assert host_share(40, 4, 8, 0.1) == pytest.approx(0.5)
    # whole hosts on both sides: the share is 1 (nothing to shrink)
    assert host_share(16, 8, 8, 0.5) == pytest.approx(1.0)


def test_fan_out_and_bias_follow_the_router_and_the_shared_tiers() -> None:
    for router in content_blind_routers():
        assert fan_out_applies(True, [])
        assert not fan_out_applies(True, ["cxl"])
        assert sample_bias(router, True, [], 0.25) is None
        assert "cxl hit ratio low" in sample_bias(router, True, ["cxl"], 0.25)
    assert not fan_out_applies(False, [])
    assert "content-affine" in sample_bias("prefix_affinity", False, [], 0.25)
    assert sample_bias("prefix_affinity", False, [], 1.0) is None  # the full trace: no bias
