"""A running vLLM's Prometheus ``/metrics`` text: read it, and write it from a replay.

vLLM exports its serving statistics through ``prometheus_client`` (metric names, label names and
bucket boundaries of vLLM 0.34.0: ``vllm/v1/metrics/loggers.py``, ``vllm/v1/metrics/buckets.py``
and ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py``; docs/sources.md,
"vLLM /metrics"). :func:`parse_metrics` reads the text exposition format with
``prometheus_client``'s own parser and sums every series of a metric over its labels (engines,
model names, finish reasons), so a multi-engine server reads as one. :func:`metrics_text`
writes the same metrics from per-request latencies, which is how a kvtier replay becomes the
``/metrics`` of a server whose parameters are known (``kvtier calibrate``'s tests).

Histograms keep their buckets; :meth:`Histogram.quantile` interpolates inside a bucket as
Prometheus's ``histogram_quantile`` does, so a quantile read from a real server and one read
from a replay binned into the same buckets are comparable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvtier.errors import InputError

# vLLM 0.34.0 vllm/v1/metrics/buckets.py: TIME_TO_FIRST_TOKEN_BUCKETS, INTER_TOKEN_LATENCY_BUCKETS
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# offloading/metrics.py: TRANSFER_SIZE_BUCKETS (bytes per load or store operation)
TRANSFER_SIZE_BUCKETS: tuple[float, ...] = (
    1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6,
)  # fmt: skip

TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"  # one observation per output token after the first
ITL_LEGACY = "vllm:time_per_output_token_seconds"  # the same histogram in older releases
TPOT = "vllm:request_time_per_output_token_seconds"  # one observation per request
PREFIX_QUERIES = "vllm:prefix_cache_queries"  # prompt tokens looked up in the GPU prefix cache
PREFIX_HITS = "vllm:prefix_cache_hits"  # ... and found there
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries"  # looked up through the KV connector
EXTERNAL_HITS = "vllm:external_prefix_cache_hits"
REQUEST_SUCCESS = "vllm:request_success"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
OFFLOAD_LOAD_BYTES = "vllm:kv_offload_load_bytes"  # OffloadingConnector, offload tier to GPU
OFFLOAD_LOAD_TIME = "vllm:kv_offload_load_time"  # seconds, summed over load operations
OFFLOAD_LOAD_SIZE = "vllm:kv_offload_load_size"  # histogram: one observation per operation
OFFLOAD_STORE_BYTES = "vllm:kv_offload_store_bytes"
OFFLOAD_STORE_TIME = "vllm:kv_offload_store_time"

# queries may exceed prompt tokens by the prompts admitted but not yet through their prefill at
# scrape time (vllm:prompt_tokens counts a prompt when its prefill ends, the query when it is
# admitted); beyond this share the scrape counts retried lookups (ServingMetrics.
# hit_ratio_counts_retries)
RETRY_LOOKUP_MARGIN = 0.10

LABELS = ("model_name", "engine")  # loggers.py: every engine metric's labels

_HELP = {  # loggers.py's documentation strings, written as vLLM writes them
    TTFT: "Histogram of time to first token in seconds.",
    ITL: "Histogram of inter-token latency in seconds.",
    TPOT: "Histogram of time_per_output_token_seconds per request.",
    PREFIX_QUERIES: "Prefix cache queries, in terms of number of queried tokens.",
    PREFIX_HITS: "Prefix cache hits, in terms of number of cached tokens.",
    REQUEST_SUCCESS: "Count of successfully processed requests.",
    PROMPT_TOKENS: "Number of prefill tokens processed.",
    GENERATION_TOKENS: "Number of generation tokens processed.",
    OFFLOAD_LOAD_BYTES: "Total bytes loaded from offload storage to GPU.",
    OFFLOAD_LOAD_TIME: "Total load time from offload storage to GPU, in seconds.",
    OFFLOAD_LOAD_SIZE: "Histogram of KV offload load operation size, in bytes.",
}


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram summed over its series: finite upper bounds, the cumulative
    count at each (the last entry is ``+Inf``'s), the sum and the count of observations."""

    bounds: np.ndarray  # float64 (k,), increasing
    cumulative: np.ndarray  # float64 (k + 1,), non-decreasing, last = count
    total: float  # the observations' sum
    count: float

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count > 0 else float("nan")

    def quantile(self, q: float) -> float:
        """The ``q`` quantile as Prometheus's ``histogram_quantile`` interpolates it: linear
        inside the bucket that holds it, from 0 below the first bound; in the ``+Inf`` bucket,
        the largest finite bound."""
        if self.count <= 0:
            return float("nan")
        rank = q * self.count
        i = int(np.searchsorted(self.cumulative, rank, side="left"))
        if i >= len(self.bounds):
            return float(self.bounds[-1])
        lo = 0.0 if i == 0 else float(self.bounds[i - 1])
        below = 0.0 if i == 0 else float(self.cumulative[i - 1])
        inside = float(self.cumulative[i]) - below
        if inside <= 0:
            return float(self.bounds[i])
        return lo + (float(self.bounds[i]) - lo) * (rank - below) / inside

    def fractions(self) -> np.ndarray:
        """The share of observations at or below each finite bound."""
        return self.cumulative[:-1] / self.count if self.count > 0 else self.cumulative[:-1]


def bucketize(
    values: np.ndarray, bounds: Iterable[float], weights: np.ndarray | None = None
) -> Histogram:
    """``values`` (each counted ``weights`` times) as a Prometheus histogram with ``bounds``
    (an observation equal to a bound falls in that bound's bucket, as ``le`` says)."""
    b = np.asarray(tuple(bounds), dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    keep = np.isfinite(v) & (w > 0)
    v, w = v[keep], w[keep]
    idx = np.searchsorted(b, v, side="left")  # first bound >= value
    per = np.bincount(idx, weights=w, minlength=len(b) + 1)[: len(b) + 1]
    return Histogram(b, np.cumsum(per), float(np.sum(v * w)), float(np.sum(w)))


@dataclass(frozen=True)
class ServingMetrics:
    """What calibration reads from one ``/metrics`` scrape (None: the server did not export
    it). ``itl`` is the per-token inter-token histogram (``ITL`` or, before vLLM 0.11,
    ``ITL_LEGACY`` in older releases); ``tpot`` the per-request one."""

    ttft: Histogram
    itl: Histogram
    prefix_queries: float
    prefix_hits: float
    tpot: Histogram | None = None
    requests: float | None = None
    external_queries: float | None = None
    external_hits: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    offload_load_bytes: float | None = None
    offload_load_time_s: float | None = None
    offload_load_ops: float | None = None
    names: dict[str, str] = field(default_factory=dict)  # role -> the metric name read

    @property
    def hit_ratio(self) -> float:
        """Prompt tokens found in the GPU prefix cache over those looked up."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries > 0 else 0.0

    @property
    def lookups_per_prompt_token(self) -> float | None:
        """Prefix-cache queries over prompt tokens (None when either is not exported).

        A release that records a request's lookup once, at admission (vLLM since PR #48860,
        merged 2026-07-21; 0.31.0 and 0.34.0 read), gives at most 1 (plus the prompts of requests
        admitted but not yet past their prefill when scraped). Earlier releases recorded a lookup
        each time the scheduler retried a waiting request it could not admit (no free blocks, no
        token budget, a connector deferring), so under KV pressure the queries exceed the prompt
        tokens and the hit ratio follows the retried requests (docs/calibrate.md)."""
        if self.prompt_tokens is None or self.prompt_tokens <= 0:
            return None
        return self.prefix_queries / self.prompt_tokens

    @property
    def hit_ratio_counts_retries(self) -> bool:
        """Whether the prefix-cache counters count retried lookups (see
        :attr:`lookups_per_prompt_token`): the queries exceed the prompt tokens by more than
        ``RETRY_LOOKUP_MARGIN``."""
        ratio = self.lookups_per_prompt_token
        return ratio is not None and ratio > 1.0 + RETRY_LOOKUP_MARGIN

    @property
    def external_hit_ratio(self) -> float | None:
        if self.external_queries is None or self.external_hits is None:
            return None
        return self.external_hits / self.external_queries if self.external_queries > 0 else 0.0

    @property
    def offload_load_rate(self) -> float | None:
        """Bytes per second the offload loads moved while running (None: not exported)."""
        if not self.offload_load_bytes or not self.offload_load_time_s:
            return None
        return self.offload_load_bytes / self.offload_load_time_s


def _families(text: str, path: str) -> dict[str, object]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError, TypeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(f"not Prometheus text exposition format ({first})", path=path) from None
    out: dict[str, object] = {}
    for fam in families:
        out[fam.name] = fam
    return out


def _counter(fams: dict[str, object], name: str) -> float | None:
    fam = fams.get(name)
    if fam is None:
        return None
    total = 0.0
    found = False
    for s in fam.samples:  # type: ignore[attr-defined]
        if s.name in (name, f"{name}_total"):
            total += float(s.value)
            found = True
    return total if found else None


def _histogram(fams: dict[str, object], name: str, path: str) -> Histogram | None:
    fam = fams.get(name)
    if fam is None:
        return None
    buckets: dict[float, float] = {}
    total = count = 0.0
    for s in fam.samples:  # type: ignore[attr-defined]
        if s.name == f"{name}_bucket":
            le = float(s.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + float(s.value)
        elif s.name == f"{name}_sum":
            total += float(s.value)
        elif s.name == f"{name}_count":
            count += float(s.value)
    if float("inf") not in buckets:
        raise InputError(f"histogram {name} has no +Inf bucket", path=path)
    les = sorted(buckets)
    cum = np.array([buckets[le] for le in les], dtype=np.float64)
    if np.any(np.diff(cum) < 0):
        raise InputError(f"histogram {name}: bucket counts decrease", path=path)
    return Histogram(np.array(les[:-1], dtype=np.float64), cum, total, count)


def parse_metrics(text: str, path: str = "<metrics>") -> ServingMetrics:
    """One ``/metrics`` scrape of a vLLM server, summed over its series.

    Raises :class:`InputError` naming ``path`` for text that is not the exposition format and
    for a missing metric calibration needs (the TTFT and inter-token histograms, the prefix
    cache's queries and hits)."""
    fams = _families(text, path)
    names: dict[str, str] = {}
    ttft = _histogram(fams, TTFT, path)
    if ttft is None or ttft.count <= 0:
        raise InputError(f"no {TTFT} observations (is this a vLLM server's /metrics?)", path=path)
    names["ttft"] = TTFT
    itl = None
    for name in (ITL, ITL_LEGACY):
        itl = _histogram(fams, name, path)
        if itl is not None:
            names["itl"] = name
            break
    if itl is None or itl.count <= 0:
        raise InputError(f"no {ITL} (or {ITL_LEGACY}) observations", path=path)
    queries = _counter(fams, PREFIX_QUERIES)
    hits = _counter(fams, PREFIX_HITS)
    if queries is None or hits is None:
        missing = PREFIX_QUERIES if queries is None else PREFIX_HITS
        raise InputError(f"no {missing} counter (vLLM v1 exports it)", path=path)
    if hits > queries:
        raise InputError(f"{PREFIX_HITS} ({hits:g}) exceeds {PREFIX_QUERIES}", path=path)
    tpot = _histogram(fams, TPOT, path)
    load_size = _histogram(fams, OFFLOAD_LOAD_SIZE, path)
    return ServingMetrics(
        ttft=ttft,
        itl=itl,
        prefix_queries=queries,
        prefix_hits=hits,
        tpot=tpot if tpot is not None and tpot.count > 0 else None,
        requests=_counter(fams, REQUEST_SUCCESS),
        external_queries=_counter(fams, EXTERNAL_QUERIES),
        external_hits=_counter(fams, EXTERNAL_HITS),
        prompt_tokens=_counter(fams, PROMPT_TOKENS),
        generation_tokens=_counter(fams, GENERATION_TOKENS),
        offload_load_bytes=_counter(fams, OFFLOAD_LOAD_BYTES),
        offload_load_time_s=_counter(fams, OFFLOAD_LOAD_TIME),
        offload_load_ops=None if load_size is None else load_size.count,
        names=names,
    )


def read_metrics(path: str) -> ServingMetrics:
    """:func:`parse_metrics` of a file (a saved ``curl http://host:8000/metrics``)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise InputError(
            "not Prometheus text exposition format (not UTF-8 text)", path=path
        ) from None
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror or err}", path=path) from None
    return parse_metrics(text, path)


def metrics_text(
    ttft_s: np.ndarray,
    itl_s: np.ndarray,
    output_tokens: np.ndarray,
    *,
    prompt_tokens: np.ndarray,
    hit_tokens: np.ndarray,
    model_name: str = "model",
    offload_load_bytes: float | None = None,
    offload_load_time_s: float | None = None,
    offload_load_sizes: np.ndarray | None = None,
) -> str:
    """The ``/metrics`` text a vLLM 0.34 server would show after serving these requests.

    Per request: time to first token, mean inter-token interval (counted once per output
    token after the first in the per-token histogram, once in the per-request one), output
    and prompt lengths, and prompt tokens found in the prefix cache; with the OffloadingConnector
    (``offload_*``), its load counters and the histogram of its load jobs' sizes. Written by
    ``prometheus_client`` with vLLM's names, help strings, labels and buckets; only the
    metrics :func:`parse_metrics` reads are written (a server shows many more)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    ttft = np.asarray(ttft_s, dtype=np.float64)
    itl = np.asarray(itl_s, dtype=np.float64)
    out = np.asarray(output_tokens, dtype=np.int64)
    done = np.isfinite(ttft)
    steps = np.where(done & np.isfinite(itl), np.maximum(out - 1, 0), 0).astype(np.float64)
    labels = [model_name, "0"]

    def hist(name: str, h: Histogram) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, _HELP[name], labels=list(LABELS))
        bucket_pairs = [
            (repr(float(b)), float(c)) for b, c in zip(h.bounds, h.cumulative, strict=False)
        ]
        bucket_pairs.append(("+Inf", float(h.cumulative[-1])))
        fam.add_metric(labels, bucket_pairs, h.total)
        return fam

    def counter(
        name: str, value: float, extra: dict[str, str] | None = None
    ) -> CounterMetricFamily:
        label_names = list(LABELS) + list(extra or {})
        fam = CounterMetricFamily(name, _HELP[name], labels=label_names)
        fam.add_metric(labels + list((extra or {}).values()), float(value))
        return fam

    with_tokens = steps > 0
    families = [
        hist(TTFT, bucketize(ttft[done], TTFT_BUCKETS)),
        hist(ITL, bucketize(itl[with_tokens], ITL_BUCKETS, steps[with_tokens])),
        hist(TPOT, bucketize(itl[with_tokens], ITL_BUCKETS)),
        counter(PREFIX_QUERIES, float(np.sum(np.asarray(prompt_tokens)[done]))),
        counter(PREFIX_HITS, float(np.sum(np.asarray(hit_tokens)[done]))),
        counter(PROMPT_TOKENS, float(np.sum(np.asarray(prompt_tokens)[done]))),
        counter(GENERATION_TOKENS, float(np.sum(out[done]))),
        counter(REQUEST_SUCCESS, float(np.sum(done)), {"finished_reason": "length"}),
    ]
    if offload_load_bytes is not None and offload_load_time_s is not None:
        sizes = np.zeros(0) if offload_load_sizes is None else np.asarray(offload_load_sizes)
        families += [
            counter(OFFLOAD_LOAD_BYTES, offload_load_bytes),
            counter(OFFLOAD_LOAD_TIME, offload_load_time_s),
            hist(OFFLOAD_LOAD_SIZE, bucketize(sizes.astype(np.float64), TRANSFER_SIZE_BUCKETS)),
        ]

    class _Collector:
        def collect(self) -> list[object]:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())  # type: ignore[arg-type]
    return generate_latest(registry).decode("utf-8")
