"""A replay that does not progress (docs/model.md): stalls counted, the replay stopped, on both
engines, at a stall derived by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.errors import InputError, StallError
from kvtier.sim import simulate_raw
from kvtier.sim.timing import prefill_attn_ns, step_time
from kvtier.trace.blocked import BlockedTrace
from tests.test_sim_disaggregated import ENGINES, config, slow_links

B = 16


def stalled_case(link_bw: float):  # noqa: ANN201
    """One prefill and one decode instance of 4 blocks each, a 16-token budget, one request
    at a time, no prefix caching; request 0 (32 tokens, 2 blocks) is handed over and its
    blocks stay held on the prefill instance until its KV is pulled over links of
    ``link_bw`` bytes/s; request 1 (48 tokens, 3 blocks) then finds 2 free blocks. Admission
    on the first chunk (vLLM without ``scheduler_reserve_full_isl``, 0.11.0): with the gate,
    request 1 would wait for request 0's blocks instead of admitting and stalling."""
    cfg = replace(
        config(2, 1), capacity_blocks=4, token_budget=B, max_seqs=1, prefix_caching=False,
        watermark_blocks=0, reserve_full_prompt=False,
    )  # fmt: skip
    trace = BlockedTrace.from_lists([0.0, 0.0], [2 * B, 3 * B], [2, 2], [[], []], B)
    return trace, slow_links(cfg, link_bw)


def chunk_s(cfg, kv: int) -> float:  # noqa: ANN001
    """One iteration of a single 16-token prefill chunk after ``kv`` computed tokens."""
    tp = cfg.instance_timings()[0]
    q = B
    return float(step_time(q, q * (2 * kv + q), kv + q, 0, 0, prefill_attn_ns(q, kv, tp), tp))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_prefill_request_that_cannot_grow_beside_held_blocks_stops_the_replay(engine) -> None:
    # The KV pull of request 0 (4.2 MB at 42 kB/s) takes about 100 s. Request 0's prompt takes
    # two chunks (c = chunk(0) + chunk(16)); it is handed over at c. Request 1 is admitted
    # then, computes two chunks (c), and at the third finds no block for tokens 32-47: it
    # preempts itself, alone on the instance (stall 1, at 2c), is admitted again at once and
    # repeats: stall s at (s + 1) c. The limit is 2 requests x 4 blocks x 16 tokens = 128
    # stalls; the 129th, at 130 c, stops the replay.
    trace, cfg = stalled_case(4.2e4)
    c = chunk_s(cfg, 0) + chunk_s(cfg, B)
    with pytest.raises(StallError) as err:
        simulate_raw(trace, cfg, engine=engine)
    e = err.value
    assert (e.request, e.instance, e.limit) == (1, 0, 128)
    assert e.now == pytest.approx(130 * c, rel=1e-12)
    assert isinstance(e, InputError)  # the CLI's one line and exit code 2
    assert "\n" not in str(e) and "request 1" in str(e) and "instance 0" in str(e)


def test_both_engines_stop_with_the_same_error() -> None:
    trace, cfg = stalled_case(4.2e4)
    messages = []
    for engine in ENGINES:
        with pytest.raises(StallError) as err:
            simulate_raw(trace, cfg, engine=engine)
        messages.append(str(err.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_stall_shorter_than_the_limit_is_replayed(engine) -> None:
    # a pull of about 0.1 s at 42 MB/s: request 1 stalls a few times, then gets its blocks
    # (request 0's freed at its next admission) and both requests finish
    trace, cfg = stalled_case(4.2e7)
    c = chunk_s(cfg, 0) + chunk_s(cfg, B)
    raw = simulate_raw(trace, cfg, engine=engine)
    assert raw.preemptions[0] == 0
    assert 1 <= raw.preemptions[1] <= 128
    assert raw.finish_s[1] > raw.kv_transfer_s[0] + c
