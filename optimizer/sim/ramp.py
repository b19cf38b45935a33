"""The closed loop's start ramp: the first wave's sends spread out, as measured clients do.

A closed loop of N clients whose first N requests all leave at one instant keeps that wave
for ever when the requests are alike: they are prefilled together, decode together and finish
together, so their successors leave together again. Measured clients are not synchronised
that way. AIPerf (NVIDIA's benchmark client, successor of GenAI-Perf) raises its concurrency
by one at evenly spaced steps over ``--concurrency-ramp-duration`` (docs/tutorials/ramping.md);
``vllm bench serve`` offers ``--ramp-up-strategy linear|exponential`` for its request rate;
and every real client adds the jitter of its own HTTP, tokenisation and scheduling, which
spreads the sends within a few lifetimes of a request (docs/sources.md, [AIPerf-ramp],
[vLLM-bench]).

kvtier models the ramp at the engine's input side: the ``k``-th request of the first wave
(``k < N``, trace order) is sent no earlier than ``t0 + k * ramp_s / N``, ``t0`` the first
trace time, and no later request before it (sends keep trace order). The engines' closed
loop is otherwise unchanged (a request leaves at the later of its trace time and a freed
slot), so both engines see the same input and agree exactly. While the ramp lasts less than
a request's lifetime no slot frees during it, and this equals AIPerf's concurrency ramp (one
more slot every ``ramp_s / N``); a slot that frees during a longer ramp stays empty until the
next ramp send, where AIPerf would refill it at once. The default length (``--ramp auto``,
:func:`auto_ramp_s`) is one request's lifetime under the loop's own load, measured by a pilot
replay.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvtier.sim.config import SimConfig
    from kvtier.trace.blocked import BlockedTrace


def alone_lifetime_s(trace: BlockedTrace, cfg: SimConfig, engine: str) -> float:
    """The lifetime (send to last token) of the trace's first request
    replayed alone on ``cfg``'s deployment, open loop (0 for an empty trace or a request
    that cannot be served)."""
    from kvtier.sim import simulate_raw

    if trace.n_requests == 0:
        return 0.0
    one = trace.head(1)
    one = one.with_arrivals(np.zeros(1))
    alone = replace(cfg, concurrency=0, round_size=0, track_tbt=False)  # (no loop to hold)
    raw = simulate_raw(one, alone, engine=engine)
    life = float(raw.finish_s[0])
    return life if math.isfinite(life) and life > 0 else 0.0


def auto_ramp_s(trace: BlockedTrace, cfg: SimConfig, engine: str) -> float:
    """The default ramp (``--ramp auto``): one request's lifetime under the loop's own load.

    A pilot replay of the closed loop (``cfg.concurrency`` N) ramped over the lifetime of the
    first request alone (:func:`alone_lifetime_s`) gives the mean lifetime, send to last
    token, of its steady window: the requests sent after the first N sends and before the last
    N (every served request when the trace holds fewer than 3N). Under load a request lives
    longer than alone, and a ramp shorter than a cycle lets the waves reform."""
    from kvtier.sim import simulate_raw

    alone = alone_lifetime_s(trace, cfg, engine)
    n = int(cfg.concurrency)
    if n <= 0 or alone <= 0:
        return alone
    pilot = trace.with_arrivals(ramp_arrivals(trace.arrival_s, n, alone))
    raw = simulate_raw(pilot, replace(cfg, track_tbt=False), engine=engine)
    sent = raw.arrival_s if raw.arrival_s is not None else pilot.arrival_s
    order = np.argsort(sent, kind="stable")
    if order.shape[0] >= 3 * n:
        order = order[n : order.shape[0] - n]
    life = (raw.finish_s - sent)[order]
    life = life[np.isfinite(life)]
    mean = float(life.mean()) if life.size else 0.0
    return mean if mean > 0 else alone


def ramp_arrivals(arrival_s: np.ndarray, concurrency: int, ramp_s: float) -> np.ndarray:
    """The trace times with the first ``concurrency`` sends spread over ``ramp_s`` seconds
    (a copy; the input unchanged; no change for an open loop or a ramp of 0)."""
    out = np.array(arrival_s, dtype=np.float64)
    n = min(int(concurrency), out.shape[0])
    if concurrency <= 0 or ramp_s <= 0 or n == 0:
        return out
    start = out[0] + np.arange(n, dtype=np.float64) * (float(ramp_s) / concurrency)
    out[:n] = np.maximum(out[:n], start)
    # trace order is send order: no later request leaves before the ramp's last send
    return np.maximum.accumulate(out)
