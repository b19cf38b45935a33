"""The closed loop's start ramp (kvtier.sim.ramp): the first wave's sends spread out, both
engines agreeing exactly on it, and what it changes in a burst of identical requests."""

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
from kvtier.sim.ramp import alone_lifetime_s, auto_ramp_s, ramp_arrivals
from kvtier.trace.format import Trace
from tests.helpers import replay_both
from tests.sim_strategies import blocked_traces, sim_configs
from tests.test_sim_differential import assert_same


def test_ramp_spreads_the_first_wave_only() -> None:
    got = ramp_arrivals(np.zeros(6), 3, 0.9)
    np.testing.assert_allclose(got, [0.0, 0.3, 0.6, 0.6, 0.6, 0.6])
    # a trace time later than the ramp's slot stays; order is kept
    got = ramp_arrivals(np.array([1.0, 1.0, 2.0, 2.0]), 2, 4.0)
    np.testing.assert_allclose(got, [1.0, 3.0, 3.0, 3.0])
    # open loop, no ramp: a copy of the input
    a = np.array([0.0, 0.5])
    for n, r in ((0, 1.0), (2, 0.0)):
        out = ramp_arrivals(a, n, r)
        np.testing.assert_array_equal(out, a)
        assert out is not a


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_engines_agree_on_a_ramped_closed_loop(data: st.DataObject) -> None:
    trace = data.draw(blocked_traces())
    cfg = data.draw(sim_configs(trace.block_tokens))
    n = data.draw(st.integers(1, 5))
    ramp = data.draw(st.sampled_from([1e-4, 1e-3, 0.01, 0.1, 1.0]))
    cfg = replace(cfg, concurrency=n)
    ramped = trace.with_arrivals(ramp_arrivals(trace.arrival_s, n, ramp))
    pair = replay_both(ramped, cfg, check_invariants=True)
    if pair is None:  # both stopped at the same stall
        return
    ref, fast = pair
    assert_same(ref, fast, ramped)
    np.testing.assert_array_equal(ref.arrival_s, fast.arrival_s)
    # no request leaves before its ramped time, and sends keep trace order
    assert np.all(ref.arrival_s >= ramped.arrival_s)
    assert np.all(np.diff(ref.arrival_s) >= 0)


def _burst(n: int, isl: int = 2000, osl: int = 200) -> Trace:
    per = -(-isl // 16)
    return Trace.from_arrays(
        arrival_s=np.zeros(n),
        input_tokens=np.full(n, isl, dtype=np.int64),
        output_tokens=np.full(n, osl, dtype=np.int64),
        hash_offsets=np.arange(n + 1, dtype=np.int64) * per,
        hashes=np.arange(1, n * per + 1, dtype=np.uint64),
        block_tokens=16,
        source="test",
    )


def _scenario(n: int, ramp: float | None, engine: str = "numba") -> Scenario:
    policy = Policy(serving=ServingPolicy(instances=1, tp=1, prefix_caching=False))
    return Scenario(
        _burst(120),
        load_hardware("h100-node"),
        load_model("Llama-3.1-8B"),
        policy,
        concurrency=n,
        ramp_s=ramp,
        engine=engine,
    )


def test_auto_ramp_is_a_loaded_lifetime_and_desynchronises_the_loop() -> None:
    """A burst of identical requests, 16 clients: with every first send at once the loop
    keeps its waves (sends bunched at a few instants per cycle, each wave's TTFT behind a
    wave of prefills); the auto ramp spreads the first wave over one request's mean lifetime
    under that load (longer than alone), after which sends stay spread and the steady TTFT
    falls."""
    n = 16
    sync = _scenario(n, 0.0).replay().raw
    auto = _scenario(n, None)
    rep = auto.replay()
    alone = Scenario(_burst(1), auto.hardware, auto.model, auto.policy).replay().raw
    assert alone_lifetime_s(rep.trace, rep.config, "numba") == pytest.approx(alone.finish_s[0])
    life = auto_ramp_s(auto.blocked(), rep.config, "numba")
    assert life > float(alone.finish_s[0])  # a request lives longer under load than alone
    # the pilot's steady lifetime is what a replay ramped over the alone lifetime shows
    pilot = _scenario(n, float(alone.finish_s[0])).replay().raw
    order = np.argsort(pilot.arrival_s, kind="stable")[n : 120 - n]
    assert life == pytest.approx(float(np.mean((pilot.finish_s - pilot.arrival_s)[order])))
    sent = rep.raw.arrival_s
    np.testing.assert_allclose(np.sort(sent)[:n], np.arange(n) * life / n)
    steady = slice(n, 120 - n)

    def distinct_sends(raw) -> int:  # noqa: ANN001
        return len(np.unique(np.sort(raw.arrival_s)[steady]))

    def ttft(raw) -> float:  # noqa: ANN001
        order = np.argsort(raw.arrival_s, kind="stable")[steady]
        return float(np.mean(raw.first_token_s[order] - raw.arrival_s[order]))

    assert distinct_sends(sync) <= (120 - 2 * n) // 2  # sends in bunches
    assert distinct_sends(rep.raw) > 0.9 * (120 - 2 * n)  # nearly every send on its own
    assert ttft(rep.raw) < 0.8 * ttft(sync)


def test_reference_engine_takes_the_same_ramp() -> None:
    a = _scenario(4, None).replay().raw
    b = _scenario(4, None, engine="reference").replay().raw
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.first_token_s, b.first_token_s)
    np.testing.assert_array_equal(a.finish_s, b.finish_s)


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_bad_ramp_names_the_option(bad: float) -> None:
    with pytest.raises(InputError) as err:
        _scenario(4, bad)
    assert err.value.option == "--ramp"


def test_replay_ramp_option(tmp_path) -> None:  # noqa: ANN001
    from kvtier.trace.io import write_trace

    path = tmp_path / "t.parquet"
    write_trace(_burst(24, 1000, 50), path)
    args = ["replay", "--trace", str(path), "--json", "--concurrency", "4"]
    args += ["--set", "serving.instances=1"]  # one instance: the four clients share it
    runs = {r: CliRunner().invoke(main, [*args, "--ramp", r]) for r in ("0", "auto", "0.5")}
    for out in runs.values():
        assert out.exit_code == 0, out.output
    ttft = {r: json.loads(o.output)["ttft_mean_s"] for r, o in runs.items()}
    assert len(set(ttft.values())) == 3  # each ramp a different first wave
    for bad in ("-1", "soon"):
        out = CliRunner().invoke(main, [*args, "--ramp", bad])
        assert out.exit_code == 2 and "--ramp" in out.output and "Traceback" not in out.output
