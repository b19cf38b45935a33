"""What llm-d's endpoint picker knows of a server's load: its metrics as last scraped.

The EPP's queue and KV-utilisation scorers read a server's waiting requests and KV use from
its ``/metrics``, which the EPP scrapes every ``--refresh-metrics-interval`` (50 ms by
default; gateway-api-inference-extension v1.0.2 ``pkg/epp/server/runserver.go``,
``pkg/epp/backend/metrics/pod_metrics.go``; llm-d-router v0.10.0 ``options.go``,
``datalayer/collector.go``); the scorers never look at the data's age
(``scorer/queuedepth/queue.go``: ``endpoint.GetMetrics().WaitingQueueSize``). vLLM sets those
gauges once a step, after it: ``Scheduler.make_stats`` runs in ``update_from_output`` and
counts the requests left waiting by the step's scheduling and the blocks in use after its
finished requests were freed (0.19.1, ``v1/core/sched/scheduler.py``); a request that reaches
the engine during a step waits in its input queue and is counted by neither. So a request
the EPP sent a few hundred milliseconds ago, into a long prefill step, is invisible to it,
and requests routed in that window may join the same server.

SGLang sets its gauges (``sglang:num_queue_reqs``, ``sglang:token_usage``, which llm-d-router
v0.10.0 reads from a pod labelled ``llm-d.ai/engine-type: sglang``: ``datalayer/extractor/
metrics/factories.go``) after each prefill batch and after every ``decode_log_interval``-th
decode batch, 40 by default (0.5.13.post1 ``batch_result_processor.py``,
``metrics_reporter.py`` ``report_decode_stats``: ``forward_ct_decode % decode_log_interval``;
``server_args.py``); so its instances report a decode step only every ``every``-th.

Each instance keeps a ring of its last ``RING`` reports, one row of ``WIDTH`` floats: ``[0]``
the reports recorded, ``[1]`` the waiting count of the step in flight (set when the step is
scheduled), ``[2]`` the decode steps it has run, then per report ``(end, waiting, free
blocks)``. At an arrival at ``t`` the EPP's last scrape was at ``floor(t / dt) * dt`` (every
server's ticker taken in phase); it sees the last report made by then, the oldest kept if
every kept one was made later, and an empty queue and pool if the instance has made none
(the gauges start at 0). Both engines call these functions (the numba engine's copies are
compiled from them).

Approximations: vLLM's async scheduling computes a step's statistics after the next step
was scheduled, and its gauges reach the API server's ``/metrics`` a moment after the step;
the scrape itself takes time; SGLang, which overlaps a batch's result processing with the
next batch, rounds its token usage to two decimals and refreshes idle gauges every 30 s.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_state import INNER

RING = 32  # reports kept per instance: 50 ms of steps down to about 1.6 ms each
_HEAD = 3  # columns before the ring
WIDTH = _HEAD + 3 * RING
_COUNT, _WAITING, _DECODES = 0, 1, 2


def new_metrics(n_instances: int) -> np.ndarray:
    """Every instance's empty ring."""
    return np.zeros((n_instances, WIDTH), dtype=np.float64)


def step_scheduled(mx: np.ndarray, k: int, waiting: int) -> None:
    """Instance ``k`` scheduled a step, leaving ``waiting`` requests waiting."""
    mx[k, _WAITING] = waiting


def step_ended(mx: np.ndarray, k: int, t: float, free: int, prefill: bool, every: int) -> None:
    """Instance ``k``'s step ended at ``t`` with ``free`` HBM blocks free: the engine reports
    that step (its waiting count as scheduled) if it ran a prefill chunk or is the
    ``every``-th decode step."""
    if not prefill:
        d = int(mx[k, _DECODES]) + 1
        mx[k, _DECODES] = d
        if d % every != 0:
            return
    n = int(mx[k, _COUNT])
    j = _HEAD + 3 * (n % RING)
    mx[k, j] = t
    mx[k, j + 1] = mx[k, _WAITING]
    mx[k, j + 2] = free
    mx[k, _COUNT] = n + 1


def scraped_at(t: float, dt: float) -> float:
    """When the EPP last scraped before an arrival at ``t`` (every ``dt`` seconds, > 0)."""
    return math.floor(t / dt) * dt


def seen(mx: np.ndarray, k: int, tick: float, capacity: int) -> tuple[int, int]:
    """(waiting, free blocks) of instance ``k`` as the EPP scraped them at ``tick``."""
    n = int(mx[k, _COUNT])
    m = n if n < RING else RING
    for back in range(m):
        j = _HEAD + 3 * ((n - 1 - back) % RING)
        if mx[k, j] <= tick:
            return int(mx[k, j + 1]), int(mx[k, j + 2])
    if n > RING:  # every kept step ended later: the oldest kept
        j = _HEAD + 3 * (n % RING)
        return int(mx[k, j + 1]), int(mx[k, j + 2])
    return 0, capacity


scraped_at_nb = njit(cache=True, nogil=True, inline="always")(scraped_at)
step_scheduled_nb = njit(cache=True, nogil=True, inline="always")(step_scheduled)
step_ended_nb = njit(cache=True, nogil=True, inline="always")(step_ended)
seen_nb = njit(cache=True, nogil=True, _nrt=False, **INNER)(seen)
