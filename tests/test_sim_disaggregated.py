"""Prefill/decode disaggregation (serving.prefill_instances): closed forms on both engines.

The P/D transfer is the connector's transfer over the topology's links (kvtier.sim.pd): each
closed form below is written from the rule in docs/model.md, not read back from the engine.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy import Policy
from kvtier.sim import build_config, simulate_raw
from kvtier.trace.blocked import BlockedTrace

ENGINES = ["reference", "numba"]
GB = 1e9


def config(instances: int, prefill: int, *, connector: str = "nixl", hosts: int = 1, **serving):
    p = Policy()
    s = replace(
        p.serving, instances=instances, prefill_instances=prefill, pd_connector=connector,
        **serving,
    )  # fmt: skip
    hw = load_hardware("h100-node")
    if hosts > 1:  # one GPU per host: every P/D transfer crosses the network
        hw = replace(hw, topology=replace(hw.topology, hosts=hosts, gpus_per_host=1))
    return build_config(hw, load_model("Llama-3.1-8B"), replace(p, serving=s))


def span(ops: int, nbytes: float, w: float, bw: float, depth: int) -> float:
    """A pipelined connector's transfer time (docs/model.md, "Transfer paths")."""
    b = nbytes / ops
    c = b / bw
    return (w + c) + (ops - 1) * max(w / depth, c)


def nixl_span(tokens: int, bw: float) -> float:
    """NIXL moving ``tokens`` of Llama-3.1-8B's KV: one descriptor per block and layer's K or
    V (vLLM's per-layer layout, 2 x 32 regions per 16-token block), 2.57 us each, 32 deep."""
    blocks = -(-tokens // 16)
    return span(blocks * 64, blocks * 16 * 131072, 2.57e-6, bw, 32)


def single(tokens: int, output: int = 4) -> BlockedTrace:
    return BlockedTrace.from_lists([0.0], [tokens], [output], [[]], 16)


def slow_links(cfg, bw: float):  # noqa: ANN001, ANN201
    """``cfg`` with every P/D link at ``bw`` bytes/s each way."""
    pd = cfg.pd
    bws = np.full(pd.n_links, bw)
    return replace(cfg, pd=replace(pd, link_bw_read=bws, link_bw_write=bws.copy()))


@pytest.mark.parametrize("engine", ENGINES)
def test_ttft_is_prefill_plus_the_connector_transfer(engine) -> None:
    # one 30k-token prompt: its prefill is the aggregated TTFT; disaggregated, the decode
    # instance (idle: it allocates at once) pulls its KV over NVLink before the first token
    t = single(30000)
    agg = simulate_raw(t, config(2, 0), engine=engine)
    cfg = config(2, 1)
    pd = simulate_raw(t, cfg, engine=engine)
    transfer = nixl_span(30000, 450 * GB)  # H100 NVLink 4, one direction, same host
    assert pd.kv_transfer_s[0] == pytest.approx(transfer, rel=1e-12)
    assert pd.first_token_s[0] == pytest.approx(agg.first_token_s[0] + transfer, rel=1e-12)
    assert pd.instance.tolist() == [0] and pd.decode_instance.tolist() == [1]
    # 3.9 GB at 450 GB/s is 8.7 ms; 120,000 descriptors at 2.57 us / 32 add 0.9 ms
    assert 9.5e-3 < transfer < 9.8e-3
    assert cfg.pd.link_names[cfg.pd.path[0, 1, 0]] == "nvlink[0]"
    assert cfg.pd.link_names[cfg.pd.path[0, 1, 1]] == "nvlink[1]"


@pytest.mark.parametrize("engine", ENGINES)
def test_transfer_bound_ttft_across_hosts(engine) -> None:
    # two hosts: GPUDirect RDMA through pcie[0], host 0's NIC out, host 1's NIC in, pcie[1];
    # the NIC (190 GB/s over 8 ConnectX-7: 23.75 GB/s each) is the bottleneck, plus the RDMA
    # round trip (8.39 us)
    t = single(30000)
    agg = simulate_raw(t, config(2, 0, hosts=2), engine=engine)
    cfg = config(2, 1, hosts=2)
    names = [cfg.pd.link_names[x] for x in cfg.pd.path[0, 1] if x >= 0]
    assert names == ["pcie[0]", "rdma.port[0.0]", "rdma.port[1.0]", "pcie[1]"]
    pd = simulate_raw(t, cfg, engine=engine)
    transfer = nixl_span(30000, 190 * GB / 8) + 8.39e-6
    assert pd.first_token_s[0] == pytest.approx(agg.first_token_s[0] + transfer, rel=1e-12)
    # a 1 GB/s network: the 3.9 GB transfer is longer than the prefill; TTFT waits for it all
    slow = simulate_raw(t, slow_links(cfg, 1 * GB), engine=engine)
    transfer = nixl_span(30000, 1 * GB) + 8.39e-6
    assert transfer > agg.first_token_s[0]
    assert slow.first_token_s[0] == pytest.approx(agg.first_token_s[0] + transfer, rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_pulls_into_one_decode_instance_queue(engine) -> None:
    # two equal prompts on two prefill instances end together; the decode instance's NIXL
    # worker reads one after the other
    t = BlockedTrace.from_lists([0.0, 0.0], [30000, 30000], [4, 4], [[], []], 16)
    cfg = replace(config(3, 2), router=0)
    pd = simulate_raw(t, cfg, engine=engine)
    one = nixl_span(30000, 450 * GB)
    assert pd.instance.tolist() == [0, 1] and pd.decode_instance.tolist() == [2, 2]
    assert pd.kv_transfer_s[0] == pytest.approx(one, rel=1e-12)
    assert pd.kv_transfer_s[1] == pytest.approx(2 * one, rel=1e-12)
    assert pd.first_token_s[1] - pd.first_token_s[0] == pytest.approx(one, rel=1e-9)


@pytest.mark.parametrize("engine", ENGINES)
def test_layerwise_push_overlaps_the_last_prefill_iteration(engine) -> None:
    # Mooncake's layer-wise prefill: the KV of each of the 32 layers leaves as it is computed.
    # An 8,000-token prompt prefills in one iteration of d seconds; the transfer of T seconds
    # overlapping it arrives at max(d + T / 32, T + d / 32) after the prefill began
    t = single(8000)
    agg = simulate_raw(t, config(2, 0), engine=engine)
    base = config(2, 0)
    fe = float(base.frontend_s + base.frontend_token_s * 8000)  # the front end's, this prompt
    d = agg.first_token_s[0] - fe
    blocks = 500
    nbytes = blocks * 16 * 131072.0
    for bw in (450 * GB, 0.5 * GB):  # NVLink (compute-bound) and a slow link (transfer-bound)
        cfg = config(2, 1, connector="mooncake-te")
        assert cfg.pd.layerwise
        if bw < 1 * GB:
            cfg = slow_links(cfg, bw)
        pd = simulate_raw(t, cfg, engine=engine)
        T = span(blocks * 64, nbytes, 7.87e-6, bw, 64)  # Transfer Engine: 7.87 us, 64 deep
        arrival = max(d + T / 32, T + d / 32)
        assert pd.first_token_s[0] == pytest.approx(arrival + fe, rel=1e-12)
        assert pd.kv_transfer_s[0] == pytest.approx(arrival - d, rel=1e-9)


@pytest.mark.parametrize("engine", ENGINES)
def test_prefill_holds_blocks_until_the_transfer_ends(engine) -> None:
    # one prefill instance whose HBM holds one 8,000-token prompt at a time, a 0.5 GB/s P/D
    # link: the second prompt is admitted only when the first one's KV has been read (its
    # blocks freed then), so it starts its prefill one transfer after the first one's end
    t = BlockedTrace.from_lists([0.0, 0.0], [8000, 8000], [2, 2], [[], []], 16)
    cfg = slow_links(replace(config(2, 1, scheduler="reserve"), capacity_blocks=700), 0.5 * GB)
    agg = simulate_raw(single(8000, 2), config(2, 0), engine=engine)
    fe = float(cfg.frontend_s + cfg.frontend_token_s * 8000)  # the front end's, each prompt
    d = agg.first_token_s[0] - fe
    T = nixl_span(8000, 0.5 * GB)
    pd = simulate_raw(t, cfg, engine=engine, check_invariants=engine == "reference")
    assert pd.first_token_s[0] == pytest.approx(d + T + fe, rel=1e-12)
    # the second prefill starts at d + T (the release), its own transfer follows
    assert pd.first_token_s[1] == pytest.approx(d + T + d + T + fe, rel=1e-12)
    assert pd.kv_transfer_s.tolist() == pytest.approx([T, T], rel=1e-9)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_waits_for_decode_blocks_before_its_transfer(engine) -> None:
    # the decode instance holds one request at a time: the second handed-over request waits
    # (counted in its transfer seconds) until the first finishes, and only then is pulled
    t = BlockedTrace.from_lists([0.0, 0.0], [8000, 8000], [3, 3], [[], []], 16)
    base = config(3, 2, scheduler="reserve")
    cfg = replace(base, router=0, capacity_blocks=600)
    pd = simulate_raw(t, cfg, engine=engine)
    T = nixl_span(8000, 450 * GB)
    assert pd.decode_instance.tolist() == [2, 2]
    assert pd.kv_transfer_s[0] == pytest.approx(T, rel=1e-9)
    # the second is admitted when the first has finished on the decode instance
    end0 = pd.finish_s[0] - float(cfg.frontend_s)
    hand = pd.first_token_s[0] - float(cfg.frontend_s) - T  # both prefills end together
    assert pd.kv_transfer_s[1] == pytest.approx(end0 - hand + T, rel=1e-9)


@pytest.mark.parametrize("engine", ENGINES)
def test_single_token_answers_never_leave_the_prefill_instance(engine) -> None:
    pd = simulate_raw(single(3000, 1), config(2, 1), engine=engine)
    assert pd.decode_instance.tolist() == [-1] and pd.kv_transfer_s.tolist() == [0.0]


def test_p_d_transfers_share_the_rdma_tiers_nic_queues() -> None:
    # with an rdma tier, the P/D path names the very port links the tier's loads cross
    from kvtier.policy.presets import load_preset

    p = load_preset("mooncake-pd")
    hw = load_hardware(p.hardware)
    hw = replace(hw, topology=replace(hw.topology, hosts=2, gpus_per_host=4))
    cfg = build_config(hw, load_model(p.model), p)
    tiers, pd = cfg.tiers, cfg.pd
    assert tiers.link_names == pd.link_names
    t = tiers.names.index("rdma")
    src, dst = 0, cfg.n_instances - 1  # host 0 to host 1
    crossed = {int(x) for x in pd.path[src, dst] if x >= 0}
    assert int(tiers.gpu_path[t, src, 2]) in crossed  # the rdma tier's port beside GPU 0
    assert int(tiers.gpu_path[t, dst, 2]) in crossed


def test_a_split_must_leave_a_decode_instance() -> None:
    with pytest.raises(InputError, match="prefill_instances = 2 leaves no decode instance"):
        config(2, 2)


def test_a_prefill_share_splits_whatever_the_instance_count() -> None:
    def split(instances: int, share: float) -> int:
        p = Policy()
        serving = replace(p.serving, instances=instances, prefill_share=share)
        hw, model = load_hardware("h100-node"), load_model("Llama-3.1-8B")
        return build_config(hw, model, replace(p, serving=serving)).n_prefill

    assert [split(8, s) for s in (0.0, 0.25, 0.5, 0.75)] == [0, 2, 4, 6]
    assert split(1, 0.5) == 0  # one instance stays aggregated
    assert split(2, 0.75) == 1 and split(3, 0.1) == 1  # at least one of each


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["mooncake-pd", "dynamo-disagg"])
def test_engines_agree_on_the_bundled_trace_across_two_hosts(preset) -> None:
    # the presets' P/D paths on two hosts of 4 GPUs: P/D pulls (NIXL, with KVBM's host tier)
    # or layer-wise pushes (Transfer Engine) crossing the NICs the rdma tier's loads and
    # copies use, behind the kv_aware router; both engines give every request the same times
    from pathlib import Path

    from kvtier.policy.presets import load_preset
    from kvtier.trace.blocks import block_trace
    from kvtier.trace.io import read_trace

    path = Path(__file__).resolve().parents[1] / "traces" / "mooncake-conversation.parquet"
    p = load_preset(preset)
    hw = load_hardware(p.hardware)
    hw = replace(hw, topology=replace(hw.topology, hosts=2, gpus_per_host=4))
    cfg = build_config(hw, load_model(p.model), p)
    trace = block_trace(read_trace(path), p.block_tokens).head(80)
    cfg = replace(cfg, track_tbt=True)
    ref = simulate_raw(trace, cfg, engine="reference", check_invariants=True)
    fast = simulate_raw(trace, cfg, engine="numba")
    fields = ("first_token_s", "finish_s", "kv_transfer_s", "link_busy_s", "link_bytes")
    for field in (*fields, "tbt_tail_s"):
        np.testing.assert_array_equal(getattr(ref, field), getattr(fast, field), err_msg=field)
    handed = ref.decode_instance >= 0
    assert handed.sum() > 60
    # some transfers cross hosts: they occupy the NICs (rdma.port links) the tiers name
    nic = [j for j, n in enumerate(cfg.pd.link_names) if n.startswith("rdma.port")]
    assert ref.link_bytes[nic].sum() > 0


def test_per_request_rows_carry_the_decode_instance_and_transfer() -> None:
    from kvtier.sim.requests import request_table

    t = BlockedTrace.from_lists([0.0, 0.0], [30000, 3000], [4, 1], [[], []], 16)
    cfg = config(2, 1)
    tables = [request_table(t, simulate_raw(t, cfg, engine=e, track_tbt=True)) for e in ENGINES]
    assert tables[0].equals(tables[1])
    rows = tables[0].to_pydict()
    assert rows["decode_instance"] == [1, -1]  # a one-token answer stays on its prefill
    # request 0's 3 intervals (k = 1): its first is from the KV's arrival on the decode side
    assert rows["tbt_tail_s"][0] is not None and rows["tbt_tail_s"][1] is None
    assert rows["kv_transfer_s"][0] == pytest.approx(nixl_span(30000, 450 * GB), rel=1e-12)
    assert rows["kv_transfer_s"][1] is None
    agg = request_table(t, simulate_raw(t, config(2, 0)))
    assert "decode_instance" not in agg.column_names


@pytest.mark.parametrize("engine", ENGINES)
def test_tbt_counts_from_the_kv_arrival_on_the_decode_instance(engine) -> None:
    """A lone handed-over request: its first token is at its KV's arrival (its TTFT), each
    later one a decode step of the decode instance later, so its intervals are those steps
    and its tail (3 intervals, k = 1) the longest, the last (its KV is largest)."""
    from kvtier.sim.timing import step_time

    cfg = config(2, 1)
    raw = simulate_raw(single(3000, 4), cfg, engine=engine, track_tbt=True)
    p = cfg.instance_timings()[1]
    steps = [float(step_time(1, 2 * kv + 1, kv + 1, 1, kv + 1, 0, p)) for kv in (3000, 3001, 3002)]
    assert raw.decode_instance[0] == 1
    assert raw.finish_s[0] - raw.first_token_s[0] == pytest.approx(sum(steps), rel=1e-9)
    assert raw.tbt_tail_s is not None
    assert raw.tbt_tail_s[0] == pytest.approx(max(steps), rel=1e-9)
    assert max(steps) == steps[-1]


def test_each_decode_rank_pulls_its_shard_through_its_own_stream() -> None:
    """A P/D connector with a stream and a staging copy (LMCache over Mooncake) runs on each
    decode rank: at tp 2 the transfer streams and stages at twice one rank's rate."""
    base = Policy()
    hw = load_hardware("h100-node")
    rates = {}
    for tp in (1, 2):
        s = replace(
            base.serving, instances=4, prefill_instances=2, pd_connector="lmcache-0.3-mooncake"
        )
        hw_tp = replace(hw, topology=replace(hw.topology, tp=tp))
        pd = build_config(hw_tp, load_model("Llama-3.1-8B"), replace(base, serving=s)).pd
        rates[tp] = (pd.stream_bw, pd.stage_bw)
    assert rates[1][0] == pytest.approx(0.67 * GB)  # the connector's one stream
    assert rates[2][0] == pytest.approx(2 * rates[1][0])
    assert rates[2][1] == pytest.approx(2 * rates[1][1])
