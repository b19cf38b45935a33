"""Prompt-length strata of a spatial sample, for post-stratified latency estimates.

A sample keeps whole roots (sessions, prefix subtrees), so how many of the longest prompts it
holds varies from sample to sample far more than its share of requests does; a latency
quantile in the tail (TTFT P99 of a thousand requests rests on its ten largest values, the
longest prompts) moves with it. Post-stratification (Cochran, *Sampling Techniques*, 3rd ed.
1977, section 5A.9 "Stratification after selection"; Holt & Smith, JRSS A 142(1), 1979)
weights each sampled request by how many requests of its stratum the full trace has over how
many the sample has, so that each stratum counts as it does in the full trace.

The strata are by ``input_tokens``, cut at the full trace's P50, P90 and P99 (numpy's
``inverted_cdf``: each edge is a prompt length that occurs), the quantiles kvtier reports, so
a quantile estimate is pinned where it is read. A request of length ``L`` is in stratum
``searchsorted(edges, L, side="left")``: 0 for ``L <= e1``, ..., 3 for ``L > e3``. The
sampler records them in ``kvtier.sample_strata`` (JSON); a sample of a sample keeps the
first full trace's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from kvtier.errors import InputError

META_SAMPLE_STRATA = "kvtier.sample_strata"
STRATA_BY = "input_tokens"
STRATA_QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class SampleStrata:
    """The strata edges and the full trace's request count in each stratum."""

    edges: tuple[int, ...]  # prompt lengths, non-decreasing, one per quantile
    population: tuple[int, ...]  # full trace's requests per stratum (len(edges) + 1)
    quantiles: tuple[float, ...] = STRATA_QUANTILES
    by: str = STRATA_BY

    def to_json(self) -> str:
        """The metadata value; the same text from the in-memory and the streamed sampler."""
        return json.dumps(
            {
                "by": self.by,
                "quantiles": list(self.quantiles),
                "edges": list(self.edges),
                "population": list(self.population),
            }
        )

    @classmethod
    def from_json(cls, text: str, path: str | None) -> SampleStrata:
        """Parse and check the metadata value; each problem is one line naming ``path`` and the
        key (malformed JSON, wrong lengths, decreasing edges, negative counts)."""

        def bad(why: str) -> InputError:
            shown = text if len(text) <= 60 else text[:60] + "..."
            return InputError(
                f"schema metadata '{META_SAMPLE_STRATA}' {why}, got {shown!r}", path=path
            )

        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            raise bad("is not valid JSON") from None
        if not isinstance(data, dict):
            raise bad("must be a JSON object")
        if data.get("by") != STRATA_BY:
            raise bad(f'must have "by": "{STRATA_BY}"')
        quantiles, edges, population = (
            data.get("quantiles"),
            data.get("edges"),
            data.get("population"),
        )
        if not (
            isinstance(quantiles, list)
            and quantiles
            and all(_is_number(q) and 0 < q < 1 for q in quantiles)
            and all(a < b for a, b in zip(quantiles, quantiles[1:], strict=False))
        ):
            raise bad('must have "quantiles": increasing numbers in (0, 1)')
        if not (isinstance(edges, list) and len(edges) == len(quantiles)):
            raise bad("must have one edge per quantile")
        if not all(_is_int(e) and e > 0 for e in edges):
            raise bad('must have "edges": positive whole token counts')
        if any(a > b for a, b in zip(edges, edges[1:], strict=False)):
            raise bad('must have non-decreasing "edges"')
        if not (isinstance(population, list) and len(population) == len(edges) + 1):
            raise bad("must have one population count per stratum (edges + 1)")
        if not all(_is_int(c) and c >= 0 for c in population) or not sum(population):
            raise bad('must have "population": counts >= 0, not all 0')
        return cls(
            edges=tuple(int(e) for e in edges),
            population=tuple(int(c) for c in population),
            quantiles=tuple(float(q) for q in quantiles),
        )

    @classmethod
    def of_histogram(cls, lengths: np.ndarray, counts: np.ndarray) -> SampleStrata:
        """The strata of a trace whose prompt lengths ``lengths`` (distinct, increasing) occur
        ``counts`` times: the same function of the same histogram in memory and streamed,
        so both samplers write the same edges."""
        n = int(counts.sum())
        cum = np.cumsum(counts)
        # inverted_cdf: the smallest length whose cumulative count reaches q * n
        edges = tuple(
            int(lengths[np.searchsorted(cum, _rank(q, n), side="left")]) for q in STRATA_QUANTILES
        )
        bounds = np.searchsorted(lengths, np.asarray(edges), side="right")
        cut = np.concatenate([[0], cum[bounds - 1], [n]])
        population = tuple(int(v) for v in np.diff(cut))
        return cls(edges=edges, population=population)

    @classmethod
    def of_lengths(cls, input_tokens: np.ndarray) -> SampleStrata:
        """The strata of a trace with these prompt lengths (see :meth:`of_histogram`)."""
        lengths, counts = np.unique(np.asarray(input_tokens, dtype=np.int64), return_counts=True)
        return cls.of_histogram(lengths, counts)

    def stratum(self, input_tokens: np.ndarray) -> np.ndarray:
        """Per request, its stratum (int64)."""
        return np.searchsorted(np.asarray(self.edges), input_tokens, side="left").astype(np.int64)

    def weights(self, input_tokens: np.ndarray) -> np.ndarray:
        """Per request of a replayed sample, its post-stratification weight: the full
        trace's count in its stratum over the sample's. A stratum the sample misses gets no
        weight; the others are renormalised by the weighted statistics themselves."""
        k = self.stratum(input_tokens)
        have = np.bincount(k, minlength=len(self.population)).astype(np.float64)
        population = np.asarray(self.population, dtype=np.float64)
        per = np.divide(population, have, out=np.zeros_like(population), where=have > 0)
        return per[k]

    def describe(self) -> str:
        """One line: how the latency figures of a replay of this sample are weighted."""
        names = "/".join(f"P{100 * q:g}" for q in self.quantiles)
        return (
            f"latency quantiles are post-stratified by prompt length ({len(self.population)} "
            f"strata at the full trace's {names} of input tokens: "
            f"{', '.join(f'{e:,}' for e in self.edges)})"
        )


def _rank(q: float, n: int) -> int:
    """The 1-based rank numpy's ``inverted_cdf`` picks for quantile ``q`` of ``n`` values."""
    return max(1, math.ceil(q * n))


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class LengthHistogram:
    """Counts of each prompt length, accumulated batch by batch (the streamed sampler's).

    ``np.bincount`` of each batch, added into one array indexed by length: exact, and its
    size is the longest prompt seen, not the number of requests.
    """

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, input_tokens: np.ndarray) -> None:
        batch = np.bincount(np.asarray(input_tokens, dtype=np.int64))
        if len(batch) > len(self.counts):
            grown = np.zeros(len(batch), dtype=np.int64)
            grown[: len(self.counts)] = self.counts
            self.counts = grown
        self.counts[: len(batch)] += batch

    def strata(self) -> SampleStrata:
        lengths = np.flatnonzero(self.counts)
        return SampleStrata.of_histogram(lengths, self.counts[lengths])
