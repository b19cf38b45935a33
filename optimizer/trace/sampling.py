"""Smaller traces that keep what matters: spatial samples of whole sessions, and time windows.

**Spatial sampling** (``kvtier trace sample --fraction F``) keeps a request when a 64-bit hash
of its *root* falls below ``F * 2**64``, as SHARDS samples cache references by a hash of their
key (Waldspurger et al., FAST'15). The root is the request's session (``session_id``) when the
trace has sessions; else its prefix subtree below the *trunk*: the first block of its prompt
that fewer than :data:`TRUNK_SHARE` of all requests read (blocks above it, such as a system
prompt every request starts with, are shared so widely that every sample keeps them hot);
else the request itself. Along a prompt the number of requests reading a block can only fall,
so every later turn of a conversation finds the same root as its first turn. Roots are salted
by tenant, since a request can only reuse its own tenant's blocks. A kept root keeps all of
its requests, so the reuse structure inside every kept session or subtree is exact, and the
sample sees about ``F`` of the load and of the distinct blocks. A replay of the sample scales
the cluster (instances) and the shared tiers' capacities by the same ``F`` (recorded in the
trace's ``kvtier.sample_fraction``), so that per-instance load and cache pressure match;
under a router blind to content the replay also restores the full cluster's routing fan-out
(:mod:`kvtier.trace.fanout`).

**Slicing** (``kvtier trace slice --start S --end E``) keeps the requests arriving in
``[S, E)`` and shifts them to start at 0. Requests whose prefix was first computed before
``S`` now find a cold cache: the first minutes of a slice act as a warm-up.

Both have streamed forms for traces larger than memory, with the same rows
(:mod:`kvtier.trace.samplestream`).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvtier.errors import InputError
from kvtier.trace.format import MIN_SAMPLE_FRACTION, Trace
from kvtier.trace.strata import SampleStrata

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
TRUNK_SHARE = 0.01  # a block read by more than 1% of the requests is trunk, not a root


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread 64-bit hash of each uint64 (vectorised)."""
    z = x.astype(np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def root_keys(trace: Trace, population: int | None = None) -> tuple[np.ndarray, str]:
    """Per request, the uint64 key of its root, and what the roots are.

    ``population`` is the number of requests the trunk share is taken of (by default the
    trace's own): a sample's roots are the full trace's when it is the full trace's count,
    since a kept subtree of many requests is a larger share of the sample than of the trace.
    """
    n = trace.n_requests
    if trace.has_column("session_id"):
        return trace.column_numpy("session_id", np.int64).view(np.uint64), "sessions"
    offsets, hashes = trace.hash_arrays()
    if len(hashes) and np.all(np.diff(offsets) > 0):
        first = _subtree_roots(offsets, hashes.astype(np.uint64), population or n)
        if trace.has_column("tenant"):
            names = trace.table.column("tenant").combine_chunks()
            if pa.types.is_dictionary(names.type):
                names = names.dictionary_decode()
            codes = pc.dictionary_encode(names).indices.to_numpy(zero_copy_only=False)
            first = first ^ _mix64(codes.astype(np.uint64) + np.uint64(1))
        return first, "prefix subtrees"
    if trace.has_column("request_id") and pa.types.is_integer(
        trace.table.column("request_id").type
    ):
        return trace.column_numpy("request_id", np.int64).view(np.uint64), "requests"
    return np.arange(n, dtype=np.uint64), "requests"


def _subtree_roots(offsets: np.ndarray, hashes: np.ndarray, n: int) -> np.ndarray:
    """Per request, the hash of its first block read by at most ``TRUNK_SHARE * n`` requests
    (its last block when the whole prompt is trunk). Every request has at least one hash."""
    _, inverse, counts = np.unique(hashes, return_inverse=True, return_counts=True)
    readers = counts[inverse.ravel()]  # each request reads each of its blocks once
    limit = max(1, int(TRUNK_SHARE * n))
    position = np.arange(len(hashes), dtype=np.int64)
    below = np.where(readers <= limit, position, np.iinfo(np.int64).max)
    first_below = np.minimum.reduceat(below, offsets[:-1])
    last = offsets[1:] - 1
    return hashes[np.where(first_below < len(hashes), first_below, last)]


def _check_options(fraction: float, seed: int, of: float = 1.0) -> None:
    """``fraction`` in (0, 1], and the sample it makes of a trace that is already an ``of``
    sample no smaller than a replay can run (``MIN_SAMPLE_FRACTION``)."""
    if not (math.isfinite(fraction) and 0 < fraction <= 1):
        raise InputError(f"must be in (0, 1], got {fraction}", option="--fraction")
    if of * fraction < MIN_SAMPLE_FRACTION:
        of_what = f"a {of:g} sample" if of < 1 else "the trace"
        raise InputError(
            f"a {fraction:g} sample of {of_what} is a {of * fraction:.3g} sample, below 2^-30: "
            "no replay could run a whole instance of it",
            option="--fraction",
        )
    if seed < 0:
        raise InputError(f"must be >= 0, got {seed}", option="--seed")


def _kept(keys: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Which root keys a ``fraction`` sample with ``seed`` keeps: a seeded 64-bit hash of the
    key below ``fraction * 2**64`` (the same decision in memory and streamed)."""
    if fraction >= 1:
        return np.ones(len(keys), dtype=bool)
    salt = _mix64(np.array([seed], dtype=np.uint64))[0]
    threshold = np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))
    return _mix64(keys ^ salt) < threshold


def kept_mask(trace: Trace, fraction: float, *, seed: int = 0) -> tuple[np.ndarray, str]:
    """Per request of ``trace``, whether its ``fraction`` sample with ``seed`` keeps it, and
    what the roots were (the rows :func:`sample` keeps, for comparing a sample with the whole
    trace request by request)."""
    _check_options(fraction, seed, trace.sample_fraction)
    keys, roots = root_keys(trace)
    return _kept(keys, fraction, seed), roots


def sample(trace: Trace, fraction: float, *, seed: int = 0) -> tuple[Trace, str]:
    """The spatial sample keeping about ``fraction`` of the roots (see the module docstring).

    ``seed`` picks another, independent sample of the same size. Returns the sampled trace
    (its ``sample_fraction`` multiplied by ``fraction``) and what its roots were.
    """
    keep, roots = kept_mask(trace, fraction, seed=seed)
    if not keep.any():
        raise InputError(
            f"a {fraction:g} sample of {trace.n_requests:,} requests ({roots}) keeps none; "
            "use a larger fraction or another seed",
            option="--fraction",
        )
    table = trace.table.filter(pa.array(keep))
    out_fraction = trace.sample_fraction * fraction
    return _rebuilt(trace, table, out_fraction, sample_strata_of(trace, out_fraction)), roots


def sample_strata_of(trace: Trace, out_fraction: float) -> SampleStrata | None:
    """The prompt-length strata a sample of ``trace`` records (:mod:`kvtier.trace.strata`):
    ``trace``'s own when it is a sample already (a sample of a sample is weighted to the first
    full trace), else those of ``trace``'s prompt lengths; none when the output keeps it all."""
    if out_fraction == 1.0:
        return None
    if trace.sample_strata is not None:
        return trace.sample_strata
    return SampleStrata.of_lengths(trace.input_tokens)


def check_window(start: float, end: float | None) -> None:
    """Refuse a slice window that is not ``0 <= start < end``."""
    if not (math.isfinite(start) and start >= 0):
        raise InputError(f"must be a number of seconds >= 0, got {start}", option="--start")
    if end is not None and not (math.isfinite(end) and end > start):
        raise InputError(f"must be a number of seconds > --start, got {end}", option="--end")


def time_slice(trace: Trace, start: float, end: float | None) -> Trace:
    """The requests arriving in ``[start, end)``, their arrivals shifted by ``-start``."""
    check_window(start, end)
    arrival = trace.arrival_s
    keep = arrival >= start
    if end is not None:
        keep &= arrival < end
    if not keep.any():
        last = float(arrival[-1])
        raise InputError(
            f"no request arrives in [{start:g}, {end if end is not None else 'end'}) "
            f"(the trace spans 0 to {last:,.1f} s)",
            option="--start",
        )
    table = trace.table.filter(pa.array(keep))
    shifted = table.column("arrival_s").to_numpy() - start
    table = table.set_column(
        table.schema.get_field_index("arrival_s"), "arrival_s", pa.array(shifted)
    )
    # a window of a sample no longer holds the population its strata count: none kept
    return _rebuilt(trace, table, trace.sample_fraction, None, shift=start)


def _rebuilt(
    trace: Trace,
    table: pa.Table,
    fraction: float,
    strata: SampleStrata | None,
    shift: float = 0.0,
) -> Trace:
    return Trace.from_table(
        table,
        block_tokens=trace.block_tokens,
        source=trace.source,
        has_prefix_info=trace.has_prefix_info,
        metadata=trace.metadata,
        sample_fraction=fraction,
        sample_strata=strata,
        arrival_offset_s=trace.arrival_offset_s + shift,
    )
