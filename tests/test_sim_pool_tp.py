"""Per-pool tensor parallelism (serving.prefill_tp / serving.decode_tp): closed forms on both
engines, per-pool capacity, placement, GPU and cost counting, policy round-trip."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.deploy.layout import plan_layout
from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy import Policy
from kvtier.policy.model import policy_from_dict, policy_to_dict
from kvtier.sim import build_config, simulate, simulate_raw
from kvtier.sim.timing import T_FRONTEND, T_FRONTEND_TOKEN, prefill_attn_ns, step_time
from kvtier.trace.blocked import BlockedTrace
from tests.test_sim_disaggregated import GB, nixl_span

ENGINES = ["reference", "numba"]
MODEL = "Llama-3.1-8B"


def policy(**serving) -> Policy:
    p = Policy()
    return replace(p, serving=replace(p.serving, **serving))


def hardware(hosts: int = 1):
    hw = load_hardware("h100-node")
    return replace(hw, topology=replace(hw.topology, hosts=hosts))


def config(hosts: int = 1, **serving):
    return build_config(hardware(hosts), load_model(MODEL), policy(**serving))


def split(**more):
    """One prefill instance of tp=2, the decode instances of tp=1."""
    return config(prefill_instances=1, prefill_tp=2, decode_tp=1, **more)


def test_each_pool_has_its_tp_capacity_and_step_times() -> None:
    cfg = split(instances=3)
    tp2, tp1 = config(tp=2, instances=1), config(tp=1, instances=1)
    assert (cfg.n_instances, cfg.n_prefill) == (3, 1)
    # weights split over 2 GPUs: the tp=2 instance holds more than twice the blocks of tp=1
    assert cfg.instance_capacity().tolist() == [tp2.capacity_blocks] + [tp1.capacity_blocks] * 2
    assert tp2.capacity_blocks > 2 * tp1.capacity_blocks
    rows = cfg.pool_timings()
    np.testing.assert_array_equal(rows[0], tp2.timing_params())
    np.testing.assert_array_equal(rows[1], tp1.timing_params())
    # a stated watermark is a share of each pool's own blocks (vLLM V1 keeps none by default)
    assert cfg.watermark_blocks == 0 and cfg.decode_watermark_blocks == 0
    marked = split(instances=3, watermark=0.01)
    assert marked.watermark_blocks == int(0.01 * tp2.capacity_blocks)
    assert marked.decode_watermark_blocks == int(0.01 * tp1.capacity_blocks)
    assert "prefill tp=2" in cfg.step_provenance and "decode tp=1" in cfg.step_provenance


@pytest.mark.parametrize("engine", ENGINES)
def test_prefill_at_the_tp2_table_decode_at_the_tp1_table(engine) -> None:
    # one 3,000-token prompt (one chunk), three output tokens: its first token is the tp=2
    # table's prefill step plus the transfer; its two decode steps are the tp=1 table's
    cfg = split(instances=2)
    t = BlockedTrace.from_lists([0.0], [3000], [3], [[]], 16)
    r = simulate_raw(t, cfg, engine=engine)
    tp2 = config(tp=2, instances=1).timing_params()
    tp1 = config(tp=1, instances=1).timing_params()
    q = 3000
    prefill = float(step_time(q, q * q, q, 0, 0, prefill_attn_ns(q, 0, tp2), tp2))
    # NIXL over NVLink: the tp=2 instance's links carry 900 GB/s, the tp=1 one's 450: the
    # decode side's bound the pull
    transfer = nixl_span(q, 450 * GB)
    assert r.kv_transfer_s[0] == pytest.approx(transfer, rel=1e-12)
    fe = float(tp1[T_FRONTEND] + tp1[T_FRONTEND_TOKEN] * q)  # the front end's, this prompt
    assert r.first_token_s[0] == pytest.approx(prefill + transfer + fe, rel=1e-12)
    end = prefill + transfer
    for ctx in (q, q + 1):  # decode steps: one token after ctx tokens of KV
        end += float(step_time(1, 2 * ctx + 1, ctx + 1, 1, ctx + 1, 0, tp1))
    assert r.finish_s[0] == pytest.approx(end + fe, rel=1e-12)
    assert r.busy_s[0] == pytest.approx(prefill, rel=1e-12)
    assert r.busy_s[1] == pytest.approx(end - prefill - transfer, rel=1e-12)
    # the tp=1 table would have taken longer for the prefill
    slow = float(step_time(q, q * q, q, 0, 0, prefill_attn_ns(q, 0, tp1), tp1))
    assert slow > prefill


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_larger_than_the_decode_pool_is_rejected(engine) -> None:
    # the decode instances hold fewer blocks than the prefill one; a request that fits only
    # the prefill instance is never served (it could not be handed over)
    cfg = replace(split(instances=2), decode_capacity_blocks=100, decode_watermark_blocks=1)
    t = BlockedTrace.from_lists([0.0, 0.0], [1600, 1000], [2, 2], [[], []], 16)
    r = simulate_raw(t, cfg, engine=engine)
    assert np.isnan(r.first_token_s[0]) and r.instance[0] == -1
    assert np.isfinite(r.finish_s[1]) and r.decode_instance[1] == 1


def test_gpus_hosts_and_cost_follow_the_pools() -> None:
    hw = hardware()
    cfg = split(instances=3)  # 2 + 1 + 1 GPUs on one host
    assert cfg.cost_per_hour == pytest.approx(4 * hw.gpu.price_per_hour + hw.host_fixed_per_hour)
    # unset instances: as many as fit the GPUs at the split asked for (2 + 6 x 1 GPUs)
    full = split()
    assert (full.n_instances, full.n_prefill) == (7, 1)
    pol = policy(prefill_instances=3, prefill_tp=2, decode_tp=1)
    layout = plan_layout(hw.topology, pol.serving)
    assert (layout.n_instances, layout.gpus) == (5, 8)
    assert layout.first_gpu == (0, 2, 4, 6, 7)


def test_a_replay_reports_the_pools_gpus() -> None:
    t = BlockedTrace.from_lists([0.0], [3000], [3], [[]], 16)
    pol = policy(prefill_instances=1, prefill_tp=2, decode_tp=1, instances=3)
    m = simulate(t, hardware(), load_model(MODEL), pol)
    assert (m.instances, m.gpus) == (3, 4)


def test_an_instance_never_spans_hosts() -> None:
    # two hosts of 8: three prefill instances of tp=1, then decode instances of tp=4: the
    # second tp=4 instance would straddle GPUs 7-10, so it starts on the next host
    hw = hardware(hosts=2)
    pol = policy(prefill_instances=3, prefill_tp=1, decode_tp=4, instances=5)
    layout = plan_layout(hw.topology, pol.serving)
    assert layout.first_gpu == (0, 1, 2, 3, 8)
    assert [layout.host_of(k) for k in range(5)] == [0, 0, 0, 0, 1]
    assert (layout.gpus, layout.hosts) == (11, 2)
    cfg = build_config(hw, load_model(MODEL), pol)
    names = cfg.pd.link_names
    assert names[cfg.pd.path[0, 3, 0]] == "nvlink[0]"  # same host: NVLink
    assert [names[x] for x in cfg.pd.path[0, 4] if x >= 0][0] == "pcie[0]"  # across: RDMA
    assert cfg.cost_per_hour == pytest.approx(
        11 * hw.gpu.price_per_hour + 2 * hw.host_fixed_per_hour
    )


def test_each_instance_has_its_own_gpus_links() -> None:
    # NVLink and PCIe of t GPUs per instance: a pull is bounded by the side with fewer GPUs
    cfg = config(prefill_instances=1, prefill_tp=2, decode_tp=4, instances=2)
    gpu = hardware().gpu
    pd = cfg.pd
    bw = dict(zip(pd.link_names, pd.link_bw_read, strict=True))
    assert bw["nvlink[0]"] == 2 * gpu.nvlink_bw and bw["nvlink[1]"] == 4 * gpu.nvlink_bw
    assert bw["pcie[0]"] == 2 * gpu.pcie_bw and bw["pcie[1]"] == 4 * gpu.pcie_bw
    t = BlockedTrace.from_lists([0.0], [3000], [2], [[]], 16)
    for engine in ENGINES:
        r = simulate_raw(t, cfg, engine=engine)
        assert r.kv_transfer_s[0] == pytest.approx(nixl_span(3000, 2 * 450 * GB), rel=1e-12)


def test_one_size_for_both_pools_is_todays_config() -> None:
    # prefill_tp = decode_tp = serving.tp changes nothing
    base = config(tp=2, prefill_instances=1)
    same = config(tp=2, prefill_instances=1, prefill_tp=2, decode_tp=2)
    assert same == base and not same.two_pools
    assert same.decode_timing is None and same.decode_capacity_blocks is None


@pytest.mark.parametrize(
    ("serving", "match"),
    [
        (
            {"prefill_tp": 3, "prefill_instances": 1},
            r"prefill_tp = 3 .*choices: 1, 2, 4, 8",
        ),
        ({"decode_tp": 2}, "no prefill/decode split"),
        ({"prefill_tp": 8, "decode_tp": 8, "prefill_instances": 1}, "no prefill/decode split"),
    ],
)
def test_impossible_splits_are_one_line_errors(serving, match) -> None:
    with pytest.raises(InputError, match=match) as err:
        config(**serving)
    assert "\n" not in str(err.value)


def test_policy_round_trip_keeps_the_pool_sizes() -> None:
    pol = policy(prefill_share=0.5, prefill_tp=2, decode_tp=1)
    data = policy_to_dict(pol)
    assert data["serving"]["prefill_tp"] == 2 and data["serving"]["decode_tp"] == 1
    assert policy_from_dict(data) == pol
    with pytest.raises(InputError, match="prefill_tp"):
        policy_from_dict({**data, "serving": {**data["serving"], "prefill_tp": 0}})
