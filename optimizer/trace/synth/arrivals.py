"""Arrival processes for synthetic traces.

Two renewal processes, both with mean rate ``rate`` requests per second:

* ``poisson``: exponential inter-arrival times, mean ``1 / rate`` (coefficient of variation 1).
* ``gamma``: gamma inter-arrival times with shape ``k = 1 / burstiness**2`` and scale
  ``1 / (rate * k)``, so the mean stays ``1 / rate`` and the coefficient of variation (standard
  deviation / mean) of the gaps equals ``burstiness``. ``burstiness = 1`` is Poisson; larger
  values give bursts separated by lulls, smaller values approach a fixed-rate stream. Note
  that vLLM's serving benchmark calls the gamma *shape* its ``--burstiness`` (there the
  coefficient of variation is ``1 / sqrt(burstiness)``); kvtier's burstiness is the coefficient
  of variation itself, which is what one measures on a recorded trace.

The first request arrives at time 0; request ``i`` arrives after ``i`` gaps.
"""

from __future__ import annotations

import numpy as np

from kvtier.errors import InputError

PROCESSES = ("poisson", "gamma")


def _gaps(
    rng: np.random.Generator, n: int, rate: float, process: str, burstiness: float
) -> np.ndarray:
    if process == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    shape = 1.0 / burstiness**2
    return rng.gamma(shape, 1.0 / (rate * shape), size=n)


def check_arrival_options(process: str, rate: float, burstiness: float) -> None:
    """Refuse an unknown process, a rate <= 0, or a burstiness that the process cannot use."""
    if process not in PROCESSES:
        raise InputError(
            f"unknown arrival process {process!r}; choose one of {', '.join(PROCESSES)}",
            option="--arrivals",
        )
    if not (np.isfinite(rate) and rate > 0):
        raise InputError(f"--rate must be a finite number > 0, got {rate}")
    if not (np.isfinite(burstiness) and burstiness > 0):
        raise InputError(f"--burstiness must be a finite number > 0, got {burstiness}")
    if process == "poisson" and burstiness != 1.0:
        raise InputError(
            f"--burstiness {burstiness} needs --arrivals gamma (Poisson arrivals have burstiness 1)"
        )


def arrival_times(
    rng: np.random.Generator,
    *,
    rate: float,
    process: str = "poisson",
    burstiness: float = 1.0,
    requests: int | None = None,
    duration: float | None = None,
) -> np.ndarray:
    """Sorted arrival times in seconds from 0: ``requests`` of them, or all before ``duration``."""
    check_arrival_options(process, rate, burstiness)
    if requests is not None:
        gaps = _gaps(rng, requests - 1, rate, process, burstiness)
        return np.concatenate(([0.0], np.cumsum(gaps)))
    assert duration is not None
    # Draw gaps in vectorised chunks until the duration is covered.
    times = [np.zeros(1)]
    last = 0.0
    chunk = max(16, int(rate * duration * 1.1) + 16)
    while last < duration:
        t = last + np.cumsum(_gaps(rng, chunk, rate, process, burstiness))
        times.append(t)
        last = float(t[-1])
    out = np.concatenate(times)
    return out[out < duration]
