"""Prefill/decode disaggregation (serving.prefill_instances): closed forms on both engines."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy import Policy
from kvtier.sim import build_config, simulate_raw
from kvtier.trace.blocked import BlockedTrace

ENGINES = ["reference", "numba"]


def config(instances: int, prefill: int, hardware: str = "h100-node"):
    p = Policy()
    serving = replace(p.serving, instances=instances, prefill_instances=prefill)
    return build_config(
        load_hardware(hardware), load_model("Llama-3.1-8B"), replace(p, serving=serving)
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_disaggregated_ttft_is_prefill_plus_transfer(engine) -> None:
    # one 30k-token prompt: its prefill is the aggregated TTFT; disaggregated, its KV then
    # crosses NVLink to the decode instance (same host) before the first token is seen
    t = BlockedTrace.from_lists([0.0], [30000], [4], [[]], 16)
    agg = simulate_raw(t, config(2, 0), engine=engine)
    cfg = config(2, 1)
    pd = simulate_raw(t, cfg, engine=engine)
    transfer = cfg.pd_latency_s + 30000 * cfg.kv_bytes_per_token / cfg.pd_bw_local
    assert pd.kv_transfer_s[0] == pytest.approx(transfer, rel=1e-12)
    assert pd.first_token_s[0] == pytest.approx(agg.first_token_s[0] + transfer, rel=1e-12)
    assert pd.instance.tolist() == [0] and pd.decode_instance.tolist() == [1]
    assert agg.decode_instance is None or agg.decode_instance.tolist() == [-1]
    # H100 NVLink 4 (450 GB/s) moves Llama-3.1-8B's 128 KiB per token: 3.9 GB in ~8.7 ms
    assert cfg.pd_bw_local == 450e9
    assert transfer == pytest.approx(30000 * 131072 / 450e9 + cfg.pd_latency_s)


@pytest.mark.parametrize("engine", ENGINES)
def test_transfer_bound_ttft_across_hosts(engine) -> None:
    # each instance on a host of its own and a 1 GB/s link: the 3.9 GB transfer takes longer
    # than the prefill, and the first token waits for it all
    t = BlockedTrace.from_lists([0.0], [30000], [4], [[]], 16)
    agg = simulate_raw(t, config(2, 0), engine=engine)
    cfg = replace(config(2, 1), pd_instances_per_host=1, pd_bw_remote=1e9)
    pd = simulate_raw(t, cfg, engine=engine)
    transfer = cfg.pd_latency_s + 30000 * cfg.kv_bytes_per_token / 1e9
    assert transfer > agg.first_token_s[0]  # transfer-bound
    assert pd.first_token_s[0] == pytest.approx(agg.first_token_s[0] + transfer, rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_transfers_into_one_decode_instance_queue(engine) -> None:
    # two equal prompts on two prefill instances end together; the second transfer into the
    # single decode instance starts when the first ends
    t = BlockedTrace.from_lists([0.0, 0.0], [30000, 30000], [4, 4], [[], []], 16)
    cfg = replace(config(3, 2), router=0)
    pd = simulate_raw(t, cfg, engine=engine)
    one = cfg.pd_latency_s + 30000 * cfg.kv_bytes_per_token / cfg.pd_bw_local
    assert pd.instance.tolist() == [0, 1] and pd.decode_instance.tolist() == [2, 2]
    assert pd.kv_transfer_s[0] == pytest.approx(one, rel=1e-12)
    assert pd.kv_transfer_s[1] == pytest.approx(2 * one, rel=1e-12)
    assert pd.first_token_s[1] - pd.first_token_s[0] == pytest.approx(one, rel=1e-9)


@pytest.mark.parametrize("engine", ENGINES)
def test_single_token_answers_never_leave_the_prefill_instance(engine) -> None:
    t = BlockedTrace.from_lists([0.0], [3000], [1], [[]], 16)
    pd = simulate_raw(t, config(2, 1), engine=engine)
    assert pd.decode_instance.tolist() == [-1] and pd.kv_transfer_s.tolist() == [0.0]


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
