"""Memory devices of a pool that does not interleave its data: one queue each (docs/model.md,
"Host topology").

A non-interleaved pool fills one device before the next, in the order blocks are first
written (dense ids), so the blocks of requests written close together share a device and
their loads queue on it, where an interleaved pool spreads every transfer over all devices.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.sim.transfer import device_link, path_transfer
from kvtier.trace.blocked import BlockedTrace

B = 256
BLOCKS = 64  # blocks a request's prompt names


def _transfer(free: np.ndarray, wfree: np.ndarray, dev: int, write: bool = False) -> float:
    """100 bytes at time 0 over one 100 B/s duplex link and, with ``dev`` >= 0, one of two
    10 B/s devices (links 1 and 2, one queue each); three connector workers (``wfree``), so
    that none waits for a worker."""
    return path_transfer(
        0.0, 100.0, 1, 0.0, np.inf, np.inf, 0, 1, 0.0, np.inf,
        np.array([0, -1, -1, -1, -1]), np.ones(5), np.array([100.0, 10.0, 10.0]),
        np.array([1, 0, 0]), 3 if write else 0, free, np.zeros(3), np.zeros(3), wfree, 0, 3,
        np.zeros(3), np.zeros(4), dev,
    )  # fmt: skip


def test_a_device_is_one_more_queue_on_the_path() -> None:
    free, wfree = np.zeros(6), np.zeros(3)  # reads' queues, then writes'
    assert _transfer(free, wfree, -1) == 1.0  # the link alone: 100 B at 100 B/s
    free, wfree = np.zeros(6), np.zeros(3)
    assert _transfer(free, wfree, 1) == 10.0  # the device's 10 B/s bounds it
    assert free[1] == 10.0
    # another device serves the next read once the shared link is free (at 1 s); the first
    # device the one after, once it is free (at 10 s)
    assert _transfer(free, wfree, 2) == 11.0
    assert _transfer(free, wfree, 1) == 20.0
    # a write has the duplex link's other queue to itself, but a device has one queue for
    # both directions: it waits for the device's reads
    assert _transfer(free, wfree, 1, write=True) == 30.0
    # the link's read queue last served the third read (10-11 s), its write queue this write
    assert free[0] == 11.0 and free[3] == 21.0


@pytest.mark.parametrize(("first", "expected"), [(0, 7), (3, 7), (4, 8), (11, 9), (12, 7), (13, 7)])
def test_device_link_fills_one_device_before_the_next(first: int, expected: int) -> None:
    # 4 blocks a device, 3 devices, the pool's first device link is 7
    assert device_link(first, 4, 3, 7) == expected


def test_interleaved_pool_has_no_device_queue() -> None:
    assert device_link(12345, 0, 32, 7) == -1


def _config(interleave: bool, hosts: int = 1):  # noqa: ANN202
    hw = load_hardware("beluga-testbed")
    hw = replace(hw, topology=replace(hw.topology, hosts=hosts, gpus_per_host=4 // hosts))
    cxl = hw.tiers["cxl"]
    # 4 devices of 2 requests' prompts each (BLOCKS blocks of B tokens a request)
    block_bytes = B * load_model("Qwen3-32B").kv_bytes_per_token("bf16")
    hw = replace(hw, tiers={**hw.tiers, "cxl": replace(
        cxl, devices=4, capacity_bytes=4 * 2 * BLOCKS * block_bytes,
    )})  # fmt: skip
    policy = Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=4, routing="round_robin"),
        # HBM holds one prompt: the second round finds the first four in the pool
        tiers=(TierPolicy(capacity_gb=5.0), TierPolicy(name="cxl", interleave=interleave)),
    )
    return build_config(hw, load_model("Qwen3-32B"), policy)


def test_build_tiers_adds_a_queue_per_device_only_without_interleaving() -> None:
    on, off = _config(True).tiers, _config(False).tiers
    assert on.device_queues()[0].tolist() == [0]
    blocks, devices, link0 = off.device_queues()
    assert blocks.tolist() == [2 * BLOCKS] and devices.tolist() == [4]
    names = off.link_names[int(link0[0]) : int(link0[0]) + 4]
    assert names == tuple(f"cxl.device[{d}]" for d in range(4))
    cxl = load_hardware("beluga-testbed").tiers["cxl"]
    assert off.link_bw_read[link0[0]] == off.link_bw_write[link0[0]] == cxl.device_bw
    assert len(off.link_names) == len(on.link_names) + 4


def _two_rounds(order: list[int]) -> BlockedTrace:
    """Eight distinct prompts written in a first round (ids in that order: two a device),
    then read back all at once in ``order`` by the four instances (round robin)."""
    ids = [list(range(r * BLOCKS, (r + 1) * BLOCKS)) for r in range(8)]
    arrivals = [10.0 * i for i in range(8)] + [1000.0] * 8
    prompts = ids + [ids[r] for r in order]
    n = B * BLOCKS + 1
    return BlockedTrace.from_lists(arrivals, [n] * 16, [1] * 16, prompts, B, n_blocks=8 * BLOCKS)


def _second_round_loads(interleave: bool, order: list[int]) -> np.ndarray:
    cfg = _config(interleave, hosts=4)  # an instance a host: the adapters do not queue them
    trace = _two_rounds(order)
    ref = simulate_raw(trace, cfg, engine="reference", check_invariants=True)
    fast = simulate_raw(trace, cfg, engine="numba")
    np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
    np.testing.assert_array_equal(ref.load_s, fast.load_s)
    np.testing.assert_array_equal(ref.link_busy_s, fast.link_busy_s)
    assert (fast.loaded_blocks[8:12].sum(axis=1) > BLOCKS // 2).all()  # most from the pool
    return fast.load_s[8:12]


def test_loads_from_one_device_queue_on_it_and_spread_ones_do_not() -> None:
    # the first four requests read back at once: prompts 0 and 1 share device 0, 2 and 3
    # device 1 (hot devices); 0, 2, 4, 6 sit on four devices
    hot = _second_round_loads(False, [0, 1, 2, 3, 4, 5, 6, 7])
    spread = _second_round_loads(False, [0, 2, 4, 6, 1, 3, 5, 7])
    interleaved = _second_round_loads(True, [0, 1, 2, 3, 4, 5, 6, 7])
    # interleaved: the host's adapters bound the four loads; spread: each load also at one
    # device's rate; hot: two loads queue on each device
    assert interleaved.max() < spread.max() < hot.max()
    assert hot.mean() > 1.5 * spread.mean()
