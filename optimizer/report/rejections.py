"""Why a replay rejected requests, in one line, and what to change.

A request is rejected on arrival when its whole footprint (prompt plus output, in blocks)
exceeds the HBM pool of the smallest instance (``SimConfig.fit_blocks``; a disaggregated request
is held by a prefill and then a decode instance), or, under the ``vllm_v0`` scheduler, when its
prompt exceeds the token budget (vLLM v0 ignores such a prompt). Without this line a replay
that served nothing shows only undefined latencies; a user needs the count, the cause and the
setting to change. Serving nothing is not bad input: the replay still exits 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvtier.policy.registries import VLLM_V0
from kvtier.sim.engine import total_blocks


def rejection_note(replay: Any) -> str | None:
    """One line on the rejected requests of ``replay`` (a :class:`kvtier.scenario.Replay`),
    or None when every request was admitted."""
    n = int(replay.metrics.n_rejected)
    if n == 0:
        return None
    cfg, trace, policy = replay.config, replay.trace, replay.policy
    need = total_blocks(trace, cfg.block_tokens)
    fit = cfg.fit_blocks()
    too_big = need > fit
    big = int(too_big.sum())
    parts = []
    of = f"{n:,} of {len(need):,} requests rejected"
    if big:
        most = int(need[too_big].max())
        capacity = policy.tiers[0].capacity_gb
        if capacity is not None:
            grow = f"raise tiers.hbm.capacity_gb (now {capacity:g} GB per instance; about "
            grow += f"{capacity * most / fit:.3g} GB holds the largest)"
        else:
            grow = "use GPUs with more HBM or a larger serving.tp"
        parts.append(
            f"{big:,} are larger than an instance's HBM pool ({fit:,} blocks of "
            f"{cfg.block_tokens} tokens; the largest needs {most:,}): {grow}, or a smaller "
            "kv_dtype (fp8), or replay a trace of shorter requests"
        )
    if cfg.scheduler == VLLM_V0 and n > big:
        long = int(((np.asarray(trace.input_tokens) > cfg.token_budget) & ~too_big).sum())
        if long:
            parts.append(
                f"{long:,} have prompts longer than the vllm_v0 token budget "
                f"({cfg.token_budget:,}): raise serving.max_num_batched_tokens"
            )
    if not parts:
        return f"{of}"
    return f"{of}: " + "; ".join(parts)
