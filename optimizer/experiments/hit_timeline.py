"""Hit ratio per tier over time: a study's best policy replayed once, its requests binned by
arrival (``kvtier report --html``).

For each window of the replayed trace's arrival times, a tier's share is the prompt tokens
its hits served (HBM: the prefix blocks found at admission, ``RawResult.hit_blocks``; a lower
tier: the blocks loaded from it, ``RawResult.loaded_blocks``) over the prompt tokens of the
requests admitted in that window: the definition of ``Metrics.hit_ratio_tokens``
(:func:`kvtier.sim.metrics.compute_metrics`) restricted to the window, so one window over the
whole trace gives the replay's own figures. A window with no admitted request has no value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

WINDOWS = 40


def hit_ratio_windows(replay: Any, windows: int = WINDOWS) -> dict[str, Any]:
    """``{"t_s": [window starts], "window_s": width, "tiers": {tier: [share or None]}}`` of one
    :class:`kvtier.scenario.Replay`."""
    raw, trace = replay.raw, replay.trace
    arrival = np.asarray(trace.arrival_s, dtype=np.float64)
    n = len(arrival)
    if n == 0:
        return {"t_s": [], "window_s": 0.0, "tiers": {}}
    B = trace.block_tokens
    admitted = raw.instance >= 0
    t0, t1 = float(arrival.min()), float(arrival.max())
    width = (t1 - t0) / windows if t1 > t0 else 1.0
    which = np.minimum(((arrival - t0) / width).astype(np.int64), windows - 1)
    prompt = np.bincount(
        which[admitted], weights=trace.input_tokens[admitted].astype(np.float64), minlength=windows
    )
    hits = {"hbm": raw.hit_blocks.astype(np.float64)}
    names = replay.config.tiers.names if replay.config.tiers is not None else ()
    loaded = raw.loaded_blocks
    for j, name in enumerate(names):
        if loaded.ndim == 2 and loaded.shape[0] == n and j < loaded.shape[1]:
            hits[name] = loaded[:, j].astype(np.float64)
    tiers: dict[str, list[float | None]] = {}
    for name, blocks in hits.items():
        served = np.bincount(which[admitted], weights=blocks[admitted] * B, minlength=windows)
        tiers[name] = [float(s / p) if p > 0 else None for s, p in zip(served, prompt, strict=True)]
    return {
        "t_s": [t0 + k * width for k in range(windows)],
        "window_s": width,
        "tiers": tiers,
    }


def study_hit_ratio_over_time(
    study: Any, *, trace_path: str | None = None, windows: int = WINDOWS
) -> dict[str, Any]:
    """The study's best trial (the closest when none meets the SLO) replayed to the end on
    the study's trace, hardware, model and load, at the load it was priced at; its hit ratio
    per tier over time (:func:`hit_ratio_windows`) with ``trial`` naming it."""
    from kvtier.experiments.whatif import study_best_on_its_trace

    setup, best, path, policy = study_best_on_its_trace(study, trace_path)
    scenario = setup.scenario(policy, trace_path=path)
    replay = scenario.replay(policy, rate_scale=best.rate_scale)
    return {"trial": best.number, **hit_ratio_windows(replay, windows)}
