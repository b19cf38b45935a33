"""The compile-ahead child (kvtier.sim.compile_ahead) compiles exactly what the event loop
calls: the same kernels with the same numba types, whatever the replay's configuration."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import typeof

from kvtier.sim import compile_ahead
from kvtier.sim.engine import kernel_inputs
from kvtier.sim.nb import new_state
from kvtier.trace.blocked import BlockedTrace
from tests.sim_strategies import blocked_traces, sim_configs, tiered_configs


def _as_read(trace: BlockedTrace) -> BlockedTrace:
    """The trace's lengths read-only, as a trace read from Parquet holds them."""
    for column in (trace.input_tokens, trace.output_tokens):
        column.flags.writeable = False
    return trace


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_state_types_do_not_depend_on_the_configuration(data: st.DataObject) -> None:
    """One sample's types serve every replay: aggregated or P/D, with or without tiers and
    faults off, any scheduler, router and step-time table."""
    trace = _as_read(data.draw(blocked_traces()))
    configs = tiered_configs if data.draw(st.booleans()) else sim_configs
    cfg = data.draw(configs(trace.block_tokens))
    rq, prm, pool, ts, tp, lk, out, _ = kernel_inputs(trace, cfg)
    state = new_state(rq, prm, pool, ts, tp, lk, out)
    assert typeof(state) == typeof(compile_ahead.sample_state())


def _cached_signatures(dispatcher: object) -> list[object]:
    return [key[0] for key in dispatcher._cache._cache_file._load_index()]  # numba's index


def test_plan_types_are_the_ones_the_event_loop_compiles() -> None:
    """After a replay of a Parquet trace, each planned kernel's on-disk cache holds the plan's
    signature, and no more signatures than the replay kernel has: a type the plan got wrong
    would be missing, or one entry more (the child's)."""
    from kvtier.scenario import Scenario
    from kvtier.sim.nb import simulate_nb

    Scenario.from_files("traces/sample-chat.parquet", block_tokens=16).replay()
    n_replay_kernels = len(_cached_signatures(simulate_nb))
    planned = compile_ahead.signatures(compile_ahead.sample_state())
    assert len(planned) == len({id(d) for d, _ in planned})
    for dispatcher, sig in planned:
        cached = _cached_signatures(dispatcher)
        name = dispatcher.py_func.__qualname__
        assert sig in cached, name
        assert len(cached) <= n_replay_kernels, name


def test_not_wanted_when_switched_off_or_on_one_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compile_ahead.ENV, "0")
    assert not compile_ahead.wanted()
    monkeypatch.setenv(compile_ahead.ENV, "1")
    monkeypatch.setattr(compile_ahead, "_cores", lambda: 1)
    assert not compile_ahead.wanted()


def test_not_wanted_once_the_kernel_is_cached() -> None:
    from kvtier.scenario import Scenario

    Scenario.from_files("traces/sample-chat.parquet", block_tokens=16).replay()
    assert not compile_ahead.wanted()


def test_the_child_stops_with_its_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launched child is terminated by ``stop`` (registered to run at exit)."""
    monkeypatch.setattr(compile_ahead, "wanted", lambda: True)
    monkeypatch.setattr(compile_ahead, "_asked", False)
    assert compile_ahead.start()
    child = compile_ahead._child
    assert child is not None and child.poll() is None
    assert not compile_ahead.start()  # (once per process)
    compile_ahead.stop()
    assert child.poll() is not None
    assert compile_ahead._child is None


def test_a_child_that_cannot_start_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_ahead, "wanted", lambda: True)
    monkeypatch.setattr(compile_ahead, "_asked", False)
    monkeypatch.setattr(compile_ahead.sys, "executable", "/nonexistent/python")
    assert not compile_ahead.start()
    assert compile_ahead._child is None


def test_sample_state_is_small() -> None:
    """The child's own replay state costs nothing: two requests on two instances."""
    state = compile_ahead.sample_state()
    assert state.rq.arrival.shape == (2,)
    assert state.prm.n_instances == 2
    assert not state.rq.input_tokens.flags.writeable
    assert np.all(state.rq.block_offsets == [0, 2, 4])
