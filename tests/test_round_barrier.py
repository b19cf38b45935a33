"""The closed loop's round barrier (``SimConfig.round_size``, ``kvtier replay --round-barrier``):
SGLang's multi-turn benchmark client sends no request of a round before every request of the
rounds before it has been answered. Both engines agree on it exactly, and no send ever
precedes the last answer of an earlier round."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.cli import main
from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy
from kvtier.scenario import Scenario
from kvtier.trace.format import Trace
from kvtier.trace.io import write_trace
from tests.helpers import replay_both
from tests.sim_strategies import blocked_traces, sim_configs
from tests.test_sim_differential import assert_same


def _rounds_hold(raw: object, size: int) -> None:
    """Every request of round ``r`` is sent no earlier than the last answer of rounds < r."""
    sent = np.asarray(raw.arrival_s)
    finish = np.asarray(raw.finish_s)
    n = sent.shape[0]
    for start in range(size, n, size):
        earlier = finish[:start]
        served = ~np.isnan(earlier)
        if not served.any():
            continue
        last = float(np.max(earlier[served]))
        assert np.all(sent[start : start + size] >= last - 1e-12), (start, last)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_engines_agree_behind_a_round_barrier(data: st.DataObject) -> None:
    trace = data.draw(blocked_traces())
    cfg = data.draw(sim_configs(trace.block_tokens))
    n = data.draw(st.integers(1, 5))
    size = data.draw(st.integers(1, 6))
    cfg = replace(cfg, concurrency=n, round_size=size)
    pair = replay_both(trace, cfg, check_invariants=True)
    if pair is None:  # both stopped at the same stall
        return
    ref, fast = pair
    assert_same(ref, fast, trace)
    np.testing.assert_array_equal(ref.arrival_s, fast.arrival_s)
    assert np.all(np.diff(ref.arrival_s) >= 0)  # sends keep trace order
    if not np.isnan(ref.finish_s).any():  # (a rejection finishes nothing: its round waits
        _rounds_hold(ref, size)  # for no answer of it)


def _conversations(clients: int, rounds: int, new_tokens: int = 1024) -> Trace:
    """``clients`` conversations of ``rounds`` rounds, round-major: each round's prompt is the
    conversation so far plus ``new_tokens``; every trace time 0."""
    per = new_tokens // 16
    blocks: list[np.ndarray] = []
    history = [np.zeros(0, dtype=np.uint64) for _ in range(clients)]
    nxt = 1
    for _ in range(rounds):
        for c in range(clients):
            history[c] = np.concatenate([history[c], np.arange(nxt, nxt + per, dtype=np.uint64)])
            nxt += per
            blocks.append(history[c])
    offsets = np.zeros(len(blocks) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blocks])
    return Trace.from_arrays(
        arrival_s=np.zeros(len(blocks)),
        input_tokens=np.array([16 * len(b) for b in blocks], dtype=np.int64),
        output_tokens=np.full(len(blocks), 8, dtype=np.int64),
        hash_offsets=offsets,
        hashes=np.concatenate(blocks),
        block_tokens=16,
        source="test",
    )


def _scenario(trace: Trace, concurrency: int, size: int, engine: str = "numba") -> Scenario:
    policy = Policy(serving=ServingPolicy(instances=1, tp=1))
    return Scenario(
        trace,
        load_hardware("h100-node"),
        load_model("Llama-3.1-8B"),
        policy,
        engine=engine,
        concurrency=concurrency,
        round_size=size,
    )


@pytest.mark.parametrize("engine", ["numba", "reference"])
def test_a_barrier_drains_each_round_before_the_next(engine: str) -> None:
    trace = _conversations(clients=6, rounds=3)
    free = _scenario(trace, 4, 0, engine).replay()
    held = _scenario(trace, 4, 6, engine).replay()
    _rounds_hold(held.raw, 6)
    # without the barrier, a round's first requests leave while the last round still runs
    sent, finish = np.asarray(free.raw.arrival_s), np.asarray(free.raw.finish_s)
    assert np.any(sent[6:12] < np.max(finish[:6]))
    # the barrier idles slots at each round's end: the run takes longer
    assert np.max(held.raw.finish_s) > np.max(free.raw.finish_s)
    # a barrier of one request is a closed loop of one
    one = _scenario(trace, 4, 1, engine).replay()
    alone = _scenario(trace, 1, 0, engine).replay()
    np.testing.assert_array_equal(one.raw.arrival_s, alone.raw.arrival_s)
    np.testing.assert_array_equal(one.raw.first_token_s, alone.raw.first_token_s)


def test_a_barrier_needs_a_closed_loop() -> None:
    trace = _conversations(clients=2, rounds=2)
    with pytest.raises(InputError, match="--concurrency"):
        _scenario(trace, 0, 2)
    with pytest.raises(InputError, match="round-barrier"):
        _scenario(trace, 2, -1)
    with pytest.raises(InputError, match="--concurrency"):
        _scenario(trace, 2, 2).replay(concurrency=0)


def test_replay_takes_the_barrier(tmp_path) -> None:
    path = tmp_path / "conv.parquet"
    write_trace(_conversations(clients=4, rounds=2), path)
    runner = CliRunner()
    base = ["replay", "--trace", str(path), "--hardware", "h100-node", "--model", "Llama-3.1-8B"]
    base += ["--set", "serving.instances=1", "--ramp", "0", "--json"]
    free = runner.invoke(main, [*base, "--concurrency", "3"])
    held = runner.invoke(main, [*base, "--concurrency", "3", "--round-barrier", "4"])
    assert free.exit_code == 0, free.output
    assert held.exit_code == 0, held.output
    # the slots idle at the round's end: the run takes longer
    assert json.loads(held.output)["duration_s"] > json.loads(free.output)["duration_s"]
    # the default ramp's pilot replays one request alone, open loop: no barrier to hold
    auto = [a for a in base if a not in ("--ramp", "0")]
    ramped = runner.invoke(main, [*auto, "--concurrency", "3", "--round-barrier", "4"])
    assert ramped.exit_code == 0, ramped.output
    bad = runner.invoke(main, [*base, "--round-barrier", "4"])
    assert bad.exit_code == 2
    assert "--round-barrier" in bad.output and "--concurrency" in bad.output
