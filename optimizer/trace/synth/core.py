"""``synthesize``: seeded synthetic request traces of four workload kinds.

The arrival process fixes *when* requests arrive (:mod:`.arrivals`); the kind fixes *what*
each prompt holds (:mod:`.kinds`); :mod:`.content` turns prompts into chained block hashes.
Everything is drawn from one ``numpy.random.Generator`` seeded with ``seed``, in a fixed
order, so a seed and a set of options always give the same table.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from kvtier.errors import InputError
from kvtier.trace.format import MAX_TOKENS, PASS_COLUMN, Trace
from kvtier.trace.synth.arrivals import arrival_times, check_arrival_options
from kvtier.trace.synth.content import prompt_hashes
from kvtier.trace.synth.kinds import BUILDERS
from kvtier.trace.synth.knobs import make_knobs

DEFAULT_REQUESTS = 1000
# The most requests one synthesis writes (all passes): a long-RAG request holds some 1,500
# block hashes (24,000 tokens at 16 a block, 8 bytes each), so ten million of them are over
# 100 GB in memory; real traces of that size are imported (kvtier trace import), not
# synthesised (docs/sources.md, "Search and tool limits").
MAX_REQUESTS = 10_000_000
DEFAULT_BLOCK_TOKENS = 16
META_PARAMS = "synth.params"


def synthesize(
    kind: str,
    *,
    requests: int | None = None,
    duration: float | None = None,
    rate: float = 1.0,
    arrivals: str = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    passes: int = 1,
    pass_gap_s: float = 60.0,
    **kind_knobs: Any,
) -> Trace:
    """A synthetic trace of ``kind`` (``chat``, ``rag``, ``agent`` or ``short``).

    Give ``requests`` (a count) or ``duration`` (seconds of arrivals), not both; with neither,
    1000 requests. ``rate`` is in requests per second; ``arrivals="gamma"`` with
    ``burstiness`` K draws gamma gaps with coefficient of variation K. ``passes`` > 1 replays
    the same requests again: pass ``p`` is pass 0 shifted by ``p * (last arrival of pass 0 +
    pass_gap_s)``, marked in an int32 ``pass`` column (the first-run / full-hit protocol of the
    Beluga paper, arXiv 2511.20172). ``requests`` and ``duration`` count one pass.
    ``kind_knobs`` are the fields of the kind's knob dataclass in
    :mod:`kvtier.trace.synth.knobs`. Bad values raise :class:`InputError`.
    """
    knobs = make_knobs(kind, kind_knobs)
    _check_common(requests, duration, block_tokens, passes, pass_gap_s, seed)
    check_arrival_options(arrivals, rate, burstiness)
    _check_size(requests, duration, rate, passes)
    if requests is None and duration is None:
        requests = DEFAULT_REQUESTS
    # Whole numbers given as floats (from Python callers) become ints for numpy.
    requests = None if requests is None else int(requests)
    seed, block_tokens, passes = int(seed), int(block_tokens), int(passes)
    rng = np.random.default_rng(seed)
    times = arrival_times(
        rng,
        rate=rate,
        process=arrivals,
        burstiness=burstiness,
        requests=requests,
        duration=duration,
    )
    n = len(times)
    prompts = BUILDERS[kind](rng, n, rate, knobs)
    _check_lengths(prompts.seg_offsets, prompts.seg_lens)
    input_tokens, offsets, hashes = prompt_hashes(
        prompts.seg_offsets, prompts.seg_ids, prompts.seg_lens, block_tokens
    )
    output_tokens = prompts.output_tokens
    extra: dict[str, np.ndarray] = {}
    if prompts.session_id is not None:
        extra["session_id"] = prompts.session_id.astype(np.int64)
    if passes > 1:
        shift = float(times[-1]) + pass_gap_s
        times = np.concatenate([times + p * shift for p in range(passes)])
        input_tokens = np.tile(input_tokens, passes)
        output_tokens = np.tile(output_tokens, passes)
        hashes = np.tile(hashes, passes)
        offsets = np.concatenate(
            [offsets[:-1] + p * offsets[-1] for p in range(passes)] + [[passes * offsets[-1]]]
        )
        extra = {k: np.tile(v, passes) for k, v in extra.items()}
        extra[PASS_COLUMN] = np.repeat(np.arange(passes, dtype=np.int32), n)
    extra = {"request_id": np.arange(len(times), dtype=np.int64), **extra}
    params = {
        "kind": kind,
        "requests": requests,
        "duration": duration,
        "rate": rate,
        "arrivals": arrivals,
        "burstiness": burstiness,
        "seed": seed,
        "block_tokens": block_tokens,
        "passes": passes,
        "pass_gap_s": pass_gap_s,
        "knobs": dataclasses.asdict(knobs),
    }
    return Trace.from_arrays(
        arrival_s=times,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        hash_offsets=offsets,
        hashes=hashes,
        block_tokens=block_tokens,
        source=f"kvtier trace synth {kind}",
        extra_columns=extra,
        metadata={META_PARAMS: json.dumps(params, sort_keys=True)},
    )


def _check_lengths(seg_offsets: np.ndarray, seg_lens: np.ndarray) -> None:
    """Refuse knobs whose draws make a prompt longer than a trace may hold (before hashing)."""
    totals = np.add.reduceat(np.asarray(seg_lens, dtype=np.float64), seg_offsets[:-1])
    if len(totals) and totals.max() > MAX_TOKENS:
        raise InputError(
            f"the length knobs make a prompt of {int(totals.max()):,} tokens, above the "
            f"supported maximum of {MAX_TOKENS:,}; choose shorter lengths"
        )


def _check_size(requests: int | None, duration: float | None, rate: float, passes: int) -> None:
    """Refuse a synthesis of more than :data:`MAX_REQUESTS` requests (expected, for a
    ``duration``), naming the options that make the count."""
    if requests is not None:
        count, made = float(requests) * passes, f"--requests {int(requests):,}"
    elif duration is not None:
        count, made = float(duration) * rate * passes, f"--duration {duration:g} x --rate {rate:g}"
    else:
        return
    if passes > 1:
        made += f" x --passes {passes:,}"
    if count > MAX_REQUESTS:
        raise InputError(
            f"{made} makes {count:,.0f} requests; trace synth writes at most {MAX_REQUESTS:,} "
            "(import a real trace of that size with kvtier trace import)",
            option="--requests" if requests is not None else "--duration",
        )


def _check_common(
    requests: int | None,
    duration: float | None,
    block_tokens: int,
    passes: int,
    pass_gap_s: float,
    seed: int,
) -> None:
    if requests is not None and duration is not None:
        raise InputError("give --requests or --duration, not both")
    if requests is not None and not (int(requests) == requests and requests >= 1):
        raise InputError(f"--requests must be an integer >= 1, got {requests}")
    if duration is not None and not (np.isfinite(duration) and duration > 0):
        raise InputError(f"--duration must be a finite number of seconds > 0, got {duration}")
    if not (int(block_tokens) == block_tokens and block_tokens >= 1):
        raise InputError(f"--block-tokens must be an integer >= 1, got {block_tokens}")
    if not (int(passes) == passes and passes >= 1):
        raise InputError(f"--passes must be an integer >= 1, got {passes}")
    if not (np.isfinite(pass_gap_s) and pass_gap_s >= 0):
        raise InputError(f"--pass-gap must be a finite number of seconds >= 0, got {pass_gap_s}")
    if not (int(seed) == seed and seed >= 0):
        raise InputError(f"--seed must be an integer >= 0, got {seed}")
